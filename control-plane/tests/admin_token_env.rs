//! The admin token's environment variable, in a process of its own: setting
//! a variable while other tests parse flags in parallel threads made those
//! see an empty token (their `Args::parse_from` reads the environment too).

use sglang_envoy_control_plane::config::Args;

/// docker compose passes `SGLANG_ENVOY_ADMIN_TOKEN` through whether .env
/// sets it or not: empty there means no token, while an empty
/// `--admin-token` on the command line stays an error.
#[test]
fn an_empty_admin_token_variable_is_no_token_but_an_empty_flag_is_refused() {
    std::env::set_var("SGLANG_ENVOY_ADMIN_TOKEN", "");
    let from_env = Args::try_parse_args(["cp"]).unwrap();
    assert_eq!(from_env.admin_token, None);
    assert!(from_env.validate().is_ok());
    std::env::remove_var("SGLANG_ENVOY_ADMIN_TOKEN");
    let flag = Args::try_parse_args(["cp", "--admin-token", ""]).unwrap();
    assert!(flag.validate().unwrap_err().contains("must not be empty"));
}
