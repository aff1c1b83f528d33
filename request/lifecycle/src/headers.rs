//! Which of the client's headers go on to a prefill worker, whoever sends
//! the prefill half (the control plane, or the filter during an outage).

use crate::names::ENDPOINT_HEADER;

/// True for a client header worth passing to the prefill worker: not a
/// pseudo-header, not one that belongs to a single hop or describes the
/// client's own body, not Envoy's, not the routing header.
pub fn forwardable(name: &str) -> bool {
    !(name.starts_with(':')
        || name.starts_with("x-envoy-")
        || name == ENDPOINT_HEADER
        || matches!(
            name,
            "host"
                | "content-length"
                | "transfer-encoding"
                | "connection"
                | "keep-alive"
                | "te"
                | "trailer"
                | "upgrade"
                | "proxy-authorization"
                | "proxy-connection"
                | "expect"
                | "accept-encoding"
        ))
}

/// The headers a prefill request carries: the client's forwardable ones
/// (names lower-cased), plus `content-type: application/json` when the
/// client sent none.
pub fn for_prefill<'a>(
    client: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = client
        .into_iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
        .filter(|(n, _)| forwardable(n))
        .collect();
    if !out.iter().any(|(n, _)| n == "content-type") {
        out.push(("content-type".into(), "application/json".into()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_and_routing_headers_stay_behind() {
        for keep in [
            "authorization",
            "traceparent",
            "x-request-id",
            "content-type",
        ] {
            assert!(forwardable(keep), "{keep}");
        }
        for drop in [
            ":path",
            "content-length",
            "x-envoy-expected-rq-timeout-ms",
            ENDPOINT_HEADER,
            "accept-encoding",
        ] {
            assert!(!forwardable(drop), "{drop}");
        }
    }

    #[test]
    fn prefill_headers_get_a_content_type_once() {
        let h = for_prefill([("Traceparent", "00-a"), ("host", "x")]);
        assert_eq!(
            h,
            [
                ("traceparent".to_string(), "00-a".to_string()),
                ("content-type".to_string(), "application/json".to_string())
            ]
        );
        let h = for_prefill([("content-type", "application/json; charset=utf-8")]);
        assert_eq!(h.len(), 1);
    }
}
