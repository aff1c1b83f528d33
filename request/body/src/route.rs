//! Which requests the router serves: the one allowlist both front doors (the
//! wasm filter and ext_proc) check every request head against. Anything
//! else is refused before it can reach a worker, so worker-internal
//! endpoints (`/flush_cache`, `/update_weights_from_disk`, `/abort_request`,
//! the simulator's `/_sim/*`...) are never reachable through the router.
//! `envoy/envoy.yaml` routes the same paths (a test checks the two agree).

/// The inference routes whose JSON body the router reads and routes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /generate` (SGLang native)
    Generate,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/rerank` (and sglang-router's alias `/rerank`, which Envoy
    /// rewrites to the worker's `/v1/rerank`)
    Rerank,
    /// `POST /v1/classify`
    Classify,
    /// `POST /v1/responses` (OpenAI Responses API, stateless)
    Responses,
}

impl Route {
    /// Every route, for tests and tables.
    pub const ALL: [Route; 7] = [
        Route::ChatCompletions,
        Route::Completions,
        Route::Generate,
        Route::Embeddings,
        Route::Rerank,
        Route::Classify,
        Route::Responses,
    ];

    /// The route for a request path; a query string is ignored.
    pub fn from_path(path: &str) -> Option<Route> {
        match strip_query(path) {
            "/v1/chat/completions" => Some(Route::ChatCompletions),
            "/v1/completions" => Some(Route::Completions),
            "/generate" => Some(Route::Generate),
            "/v1/embeddings" => Some(Route::Embeddings),
            "/v1/rerank" | "/rerank" => Some(Route::Rerank),
            "/v1/classify" => Some(Route::Classify),
            "/v1/responses" => Some(Route::Responses),
            _ => None,
        }
    }

    /// The worker path of this route (metrics label, prefill requests).
    pub fn path(self) -> &'static str {
        match self {
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Generate => "/generate",
            Route::Embeddings => "/v1/embeddings",
            Route::Rerank => "/v1/rerank",
            Route::Classify => "/v1/classify",
            Route::Responses => "/v1/responses",
        }
    }

    /// Prefix of request ids sglang-router generates for this route.
    pub fn rid_prefix(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chatcmpl-",
            Route::Completions => "cmpl-",
            Route::Generate => "gnt-",
            Route::Responses => "resp-",
            Route::Embeddings | Route::Rerank | Route::Classify => "req-",
        }
    }
}

/// `GET` paths answered by any healthy worker (model and server info, and
/// the worker-side generation check), with no body and no load counted.
pub const INFO_PATHS: [&str; 6] = [
    "/v1/models",
    "/get_model_info",
    "/get_server_info",
    "/model_info",
    "/server_info",
    "/health_generate",
];

/// True for a path of [`INFO_PATHS`] (a query string is ignored).
pub fn is_info_path(path: &str) -> bool {
    INFO_PATHS.contains(&strip_query(path))
}

/// What a request head asks of the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// An inference request: its body is read and routed on.
    Inference(Route),
    /// An info `GET`, sent to any healthy worker.
    Info,
}

/// A request refused from its head alone, with the status and OpenAI error
/// type and message the client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error `type`.
    pub kind: &'static str,
    /// Error message.
    pub message: String,
}

impl Refusal {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            kind,
            message: message.into(),
        }
    }
}

/// What the router needs to know of a request head to accept or refuse it.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// `:method`
    pub method: &'a str,
    /// `:path`, query string included.
    pub path: &'a str,
    /// The head ends the request (no body follows).
    pub end_of_stream: bool,
    /// The `content-length` header, when present and a number.
    pub content_length: Option<usize>,
    /// The largest body the router buffers.
    pub max_body_bytes: usize,
}

impl Head<'_> {
    /// Accepts the head as an endpoint the router serves, or refuses it:
    /// 404 for a path it does not serve, 405 for the wrong method, 400 for
    /// an inference request without a body, 413 for a declared body over
    /// the limit.
    pub fn check(&self) -> Result<Endpoint, Refusal> {
        if let Some(route) = Route::from_path(self.path) {
            if self.method != "POST" {
                return Err(Refusal::new(
                    405,
                    "invalid_request_error",
                    "use POST for this route",
                ));
            }
            if self.end_of_stream {
                return Err(Refusal::new(
                    400,
                    "invalid_request_error",
                    "request body is required",
                ));
            }
            if self.content_length.is_some_and(|n| n > self.max_body_bytes) {
                return Err(too_large(self.max_body_bytes));
            }
            return Ok(Endpoint::Inference(route));
        }
        if is_info_path(self.path) {
            if self.method != "GET" {
                return Err(Refusal::new(
                    405,
                    "invalid_request_error",
                    "use GET for this route",
                ));
            }
            return Ok(Endpoint::Info);
        }
        Err(Refusal::new(
            404,
            "not_found_error",
            "the router does not serve this path",
        ))
    }
}

/// The refusal of a body over `max` bytes.
pub fn too_large(max: usize) -> Refusal {
    Refusal::new(
        413,
        "invalid_request_error",
        format!("request body is larger than the router's limit of {max} bytes"),
    )
}

/// The refusal of a body the router cannot hold right now (its budget for
/// request bodies is spent).
pub fn over_budget() -> Refusal {
    Refusal::new(
        503,
        "service_unavailable",
        "the router holds too many request bodies right now; retry shortly",
    )
}

fn strip_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &'static str, path: &'static str) -> Head<'static> {
        Head {
            method,
            path,
            end_of_stream: false,
            content_length: None,
            max_body_bytes: 100,
        }
    }

    #[test]
    fn paths_map_to_routes_ignoring_query() {
        assert_eq!(
            Route::from_path("/v1/chat/completions?x=1"),
            Some(Route::ChatCompletions)
        );
        assert_eq!(Route::from_path("/generate"), Some(Route::Generate));
        assert_eq!(Route::from_path("/rerank"), Some(Route::Rerank));
        assert_eq!(Route::from_path("/v1/chat/completion"), None);
        assert!(is_info_path("/v1/models"));
        assert!(!is_info_path("/v1/models/x"));
        for r in Route::ALL {
            assert_eq!(Route::from_path(r.path()), Some(r));
        }
    }

    #[test]
    fn heads_are_accepted_or_refused() {
        let status = |h: Head| h.check().map_err(|r| r.status);
        assert_eq!(
            status(head("POST", "/generate")),
            Ok(Endpoint::Inference(Route::Generate))
        );
        assert_eq!(
            status(head("GET", "/get_server_info?x")),
            Ok(Endpoint::Info)
        );
        assert_eq!(status(head("GET", "/generate")), Err(405));
        assert_eq!(status(head("POST", "/v1/models")), Err(405));
        for unserved in [
            "/_sim/config",
            "/flush_cache",
            "/update_weights_from_disk",
            "/v1/chat%2Fcompletions",
            "/",
            "",
        ] {
            assert_eq!(status(head("POST", unserved)), Err(404), "{unserved}");
            assert_eq!(status(head("GET", unserved)), Err(404), "{unserved}");
        }
        let mut h = head("POST", "/v1/completions");
        h.end_of_stream = true;
        assert_eq!(status(h), Err(400));
        h.end_of_stream = false;
        h.content_length = Some(101);
        assert_eq!(status(h), Err(413));
        h.content_length = Some(100);
        assert!(status(h).is_ok());
    }
}
