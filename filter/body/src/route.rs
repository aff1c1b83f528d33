/// The inference routes whose JSON body the filter reads and routes on.
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
    /// `POST /v1/rerank`
    Rerank,
}

impl Route {
    /// The route for a request path; a query string is ignored.
    pub fn from_path(path: &str) -> Option<Route> {
        match strip_query(path) {
            "/v1/chat/completions" => Some(Route::ChatCompletions),
            "/v1/completions" => Some(Route::Completions),
            "/generate" => Some(Route::Generate),
            "/v1/embeddings" => Some(Route::Embeddings),
            "/v1/rerank" => Some(Route::Rerank),
            _ => None,
        }
    }

    /// Prefix of request ids sglang-router generates for this route.
    pub fn rid_prefix(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chatcmpl-",
            Route::Completions => "cmpl-",
            Route::Generate => "gnt-",
            Route::Embeddings | Route::Rerank => "req-",
        }
    }
}

/// `GET` routes answered by any healthy worker (model and server info).
pub fn is_info_path(path: &str) -> bool {
    matches!(
        strip_query(path),
        "/v1/models" | "/get_model_info" | "/get_server_info"
    )
}

fn strip_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_routes_ignoring_query() {
        assert_eq!(
            Route::from_path("/v1/chat/completions?x=1"),
            Some(Route::ChatCompletions)
        );
        assert_eq!(Route::from_path("/generate"), Some(Route::Generate));
        assert_eq!(Route::from_path("/v1/chat/completion"), None);
        assert!(is_info_path("/v1/models"));
        assert!(!is_info_path("/v1/models/x"));
    }
}
