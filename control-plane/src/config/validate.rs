//! The combinations of flags the control plane refuses to start with.

use super::Args;

impl Args {
    /// Rejects values no policy can work with.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.cache_threshold) {
            return Err(format!(
                "--cache-threshold must be within 0..1, got {}",
                self.cache_threshold
            ));
        }
        if self.policy == super::PolicyKind::Bucket
            || self.decode_policy == Some(super::PolicyKind::Bucket)
        {
            return Err(
                "bucket is a prefill policy: give it as --prefill-policy bucket (with --pd-disaggregation)"
                    .into(),
            );
        }
        if self.prefill_policy == Some(super::PolicyKind::Bucket) && !self.pd_disaggregation {
            return Err("--prefill-policy bucket needs --pd-disaggregation".into());
        }
        self.validate_smg_policy_flags()?;
        if self.bucket_adjust_interval_secs == 0 {
            return Err("--bucket-adjust-interval-secs must be at least 1".into());
        }
        let b = &self.prometheus_duration_buckets;
        if b.iter().any(|x| !x.is_finite() || *x <= 0.0) || b.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "--prometheus-duration-buckets must be positive seconds in ascending order, got {b:?}"
            ));
        }
        let every = self.load_monitor_interval;
        if !every.is_finite() || !(0.05..=3600.0).contains(&every) {
            return Err(format!(
                "--load-monitor-interval must be between 0.05 and 3600 seconds, got {every}"
            ));
        }
        if self.balance_rel_threshold < 1.0 {
            return Err("--balance-rel-threshold must be at least 1.0".into());
        }
        if self.health_check_interval_secs == 0
            || self.eviction_interval_secs == 0
            || self.worker_startup_check_interval == 0
        {
            return Err("intervals must be at least one second".into());
        }
        if self.retry_max_retries == 0 {
            return Err("--retry-max-retries counts attempts and must be at least 1".into());
        }
        if self.retry_initial_backoff_ms == 0
            || self.retry_max_backoff_ms < self.retry_initial_backoff_ms
        {
            return Err(
                "--retry-initial-backoff-ms must be above 0 and at most --retry-max-backoff-ms"
                    .into(),
            );
        }
        if self.retry_backoff_multiplier < 1.0 || !(0.0..=1.0).contains(&self.retry_jitter_factor) {
            return Err(
                "--retry-backoff-multiplier must be at least 1 and --retry-jitter-factor within 0..1"
                    .into(),
            );
        }
        if self.max_concurrent_requests > 0 && self.queue_size > 0 && self.queue_timeout_secs == 0 {
            return Err("--queue-timeout-secs must be at least 1 with a queue".into());
        }
        if self.cb_failure_threshold == 0
            || self.cb_success_threshold == 0
            || self.cb_timeout_duration_secs == 0
            || self.cb_window_duration_secs == 0
        {
            return Err("--cb-* thresholds and durations must be at least 1".into());
        }
        if self.health_failure_threshold == 0 || self.health_success_threshold == 0 {
            return Err("health thresholds must be at least 1".into());
        }
        if !self.health_check_endpoint.starts_with('/') {
            return Err("--health-check-endpoint must start with /".into());
        }
        if self
            .admin_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err("--admin-token must not be empty".into());
        }
        if self.fleet_store.fleet_store_url.is_some()
            && (self.service_discovery || self.pool_name.is_some())
        {
            return Err(
                "--fleet-store-url shares a worker list kept through the admin API; with --service-discovery or --pool-name every control plane already reads the same list from Kubernetes"
                    .into(),
            );
        }
        if self.pool_name.is_some() && (self.service_discovery || self.pd_disaggregation) {
            return Err(
                "--pool-name serves an InferencePool's pods; it does not mix with --service-discovery or --pd-disaggregation"
                    .into(),
            );
        }
        if self.cert_path.is_some() && !self.secure_serving {
            return Err("--cert-path is for --secure-serving; give both".into());
        }
        if self.client_cert_path.is_some() != self.client_key_path.is_some() {
            // sglang-router's message, word for word.
            return Err(
                "Both --client-cert-path and --client-key-path must be specified together".into(),
            );
        }
        if self.pd_disaggregation {
            if !self.worker_urls.is_empty() {
                return Err(
                    "--worker-urls is for regular mode; with --pd-disaggregation use --prefill and --decode"
                        .into(),
                );
            }
            self.prefill_workers()?;
        } else if !self.prefill.is_empty() || !self.decode.is_empty() {
            return Err("--prefill and --decode need --pd-disaggregation".into());
        }
        Ok(())
    }

    /// smg 1.13.0's checks of its policies' flags (the same bounds; smg
    /// words them by its config fields).
    fn validate_smg_policy_flags(&self) -> Result<(), String> {
        if self.smg_policies.prefix_token_count == 0 {
            return Err("--prefix-token-count must be above 0".into());
        }
        let factor = self.smg_policies.prefix_hash_load_factor;
        if !factor.is_finite() || factor < 1.0 {
            return Err(format!(
                "--prefix-hash-load-factor must be finite and at least 1.0, got {factor}"
            ));
        }
        let weight = self.smg_policies.least_load_kv_pressure_weight;
        if !weight.is_finite() || weight < 0.0 {
            return Err(format!(
                "--least-load-kv-pressure-weight must be finite and at least 0.0, got {weight}"
            ));
        }
        let throughput = self.smg_policies.least_load_default_throughput;
        if !throughput.is_finite() || throughput <= 0.0 {
            return Err(format!(
                "--least-load-default-throughput must be finite and above 0.0, got {throughput}"
            ));
        }
        if self.smg_policies.least_load_mean_prefill_tokens == 0 {
            return Err("--least-load-mean-prefill-tokens must be above 0".into());
        }
        Ok(())
    }
}
