//! The proxy's HTTP server: hyper's HTTP/1.1 server on worker threads ([`listen`]), and the
//! request and answer types the handlers use ([`Request`], [`Response`]).

pub mod listen;
mod payload;
mod request;
mod response;

pub use payload::Payload;
pub use request::Request;
pub use response::{Body, BoxError, Response, ResponseBuilder};
