//! The proxy's HTTP server: its own HTTP/1.1 connections ([`conn`]) on worker threads
//! ([`listen`]), and the request and answer types the handlers use ([`Request`], [`Response`]).

mod conn;
pub mod listen;
mod payload;
mod request;
mod response;

pub use payload::{BodyError, Payload};
pub use request::Request;
pub use response::{Body, BoxError, Response, ResponseBuilder};
