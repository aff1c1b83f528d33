//! What an answer's status says about the worker that gave it.

/// True when an answer with `status` says the worker failed the request
/// (and another worker may not): a 5xx, 408 (it timed out), 429 (it is
/// overloaded), or 0 (no answer at all). A client's own 4xx is not the
/// worker's failure. Retries, circuit breakers and the PD prefill's
/// accounting all judge by this one rule.
pub fn is_worker_failure(status: u32) -> bool {
    status == 0 || status >= 500 || status == 408 || status == 429
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_failures_are_5xx_408_429_and_none() {
        for s in [0, 408, 429, 500, 502, 503, 504] {
            assert!(is_worker_failure(s), "{s}");
        }
        for s in [200, 204, 400, 401, 404, 413, 422] {
            assert!(!is_worker_failure(s), "{s}");
        }
    }
}
