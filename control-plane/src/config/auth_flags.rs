//! sglang-router's control-plane authentication flags, under its names:
//! who may change the fleet through the admin API besides the holder of
//! `--admin-token`. `auth/` does the checking.

use clap::{ArgAction, Args};

/// The admin API's credentials beyond `--admin-token`.
#[derive(Debug, Clone, Default, Args)]
pub struct AuthFlags {
    /// API keys for the admin API, `id:name:role:key` (role `admin` or
    /// `user`; only `admin` may change the fleet), e.g.
    /// `'ci:CI pipeline:admin:s3cret'`. Several may follow one flag, and the
    /// flag may be repeated.
    #[arg(long, num_args = 0.., action = ArgAction::Append, value_name = "ID:NAME:ROLE:KEY")]
    pub control_plane_api_keys: Vec<String>,

    /// Log one audit event (target `sglang_envoy_control_plane::audit`)
    /// for every attempt to change the fleet: who, how authenticated, what,
    /// and whether it was allowed.
    #[arg(long)]
    pub control_plane_audit_enabled: bool,

    /// OIDC issuer whose JWTs the admin API accepts (`iss` must equal it).
    #[arg(long, value_name = "URL")]
    pub jwt_issuer: Option<String>,

    /// The `aud` a JWT must carry (not checked when not given).
    #[arg(long)]
    pub jwt_audience: Option<String>,

    /// Where the issuer's signing keys are; when not given, found through
    /// `<issuer>/.well-known/openid-configuration`.
    #[arg(long, value_name = "URL")]
    pub jwt_jwks_uri: Option<String>,

    /// `idp_role=gateway_role` (gateway roles `admin` and `user`): which of
    /// the token's roles (claims `roles`, `role`, `groups`, `group`) make
    /// its holder an admin.
    #[arg(long, num_args = 0.., action = ArgAction::Append, value_name = "IDP_ROLE=ROLE")]
    pub jwt_role_mapping: Vec<String>,
}
