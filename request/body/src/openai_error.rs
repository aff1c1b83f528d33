use serde::Serialize;

#[derive(Serialize)]
struct Envelope<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<()>,
    code: Code<'a>,
}

/// OpenAI's `code`: this router's errors give the HTTP status; some, like
/// smg's, a name (`model_not_found`).
#[derive(Serialize)]
#[serde(untagged)]
enum Code<'a> {
    Status(u16),
    Name(&'a str),
}

/// The OpenAI error body: `{"error":{"message":..,"type":..,"param":null,"code":status}}`.
///
/// Clients such as the official `openai` package read `error.message` from it.
pub fn openai_error_json(status: u16, kind: &str, message: &str) -> String {
    openai_error_json_coded(status, kind, message, "")
}

/// [`openai_error_json`] with `code` as the error's `code` (e.g.
/// `model_not_found`); an empty `code` gives the status there.
pub fn openai_error_json_coded(status: u16, kind: &str, message: &str, code: &str) -> String {
    let envelope = Envelope {
        error: Detail {
            message,
            kind,
            param: None,
            code: if code.is_empty() {
                Code::Status(status)
            } else {
                Code::Name(code)
            },
        },
    };
    // Serialising plain strings and integers cannot fail; the fallback keeps the
    // filter panic-free all the same.
    serde_json::to_string(&envelope)
        .unwrap_or_else(|_| format!("{{\"error\":{{\"message\":\"internal error\",\"type\":\"internal_error\",\"param\":null,\"code\":{status}}}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_message_and_keeps_shape() {
        let json = openai_error_json(400, "invalid_request_error", "bad \"quote\"");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["error"]["message"], "bad \"quote\"");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], 400);
        assert!(v["error"]["param"].is_null());
    }

    #[test]
    fn a_named_code_replaces_the_status() {
        let json = openai_error_json_coded(404, "invalid_request_error", "no", "model_not_found");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let plain = openai_error_json_coded(404, "not_found", "no", "");
        assert_eq!(plain, openai_error_json(404, "not_found", "no"));
    }
}
