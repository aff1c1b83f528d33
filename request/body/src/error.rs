/// Why a body cannot be routed. Each maps to a 400 for the client.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    /// The bytes are not JSON at all.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// Valid JSON, but not an object (e.g. an array or a string).
    #[error("request body must be a JSON object: {0}")]
    NotAnObject(String),
    /// Arrays and objects nest deeper than the limit.
    #[error("request body nests arrays and objects deeper than {0} levels")]
    TooDeep(usize),
    /// More top-level fields than the limit.
    #[error("request body has more than {0} top-level fields")]
    TooManyFields(usize),
    /// A value handed to [`crate::RequestBody::with_fields`] is not JSON.
    #[error("value to inject for `{0}` is not valid JSON")]
    InvalidInjection(String),
    /// A [`crate::Layout`] was asked to edit a body other than its own.
    #[error("the body changed since it was parsed")]
    NotItsBody,
}
