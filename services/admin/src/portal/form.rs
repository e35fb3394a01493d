//! An `application/x-www-form-urlencoded` body as ordered pairs. Hand-rolled over
//! `url::form_urlencoded` rather than `web::Form<T>` because the simulator's check boxes repeat
//! a name, and because the target form maps fields to JSON paths itself.

use actix_web::{FromRequest, HttpRequest, dev::Payload};
use futures_util::future::LocalBoxFuture;

use crate::api::Body;
use crate::error::ApiError;

pub struct Form {
    pairs: Vec<(String, String)>,
}

impl Form {
    pub fn parse(body: &[u8]) -> Form {
        Form { pairs: url::form_urlencoded::parse(body).map(|(k, v)| (k.into_owned(), v.into_owned())).collect() }
    }

    /// The first value of `name`, or "".
    pub fn get(&self, name: &str) -> &str {
        self.pairs.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
    }

    /// The trimmed value, or `None` when it is empty.
    pub fn text(&self, name: &str) -> Option<String> {
        Some(self.get(name).trim()).filter(|v| !v.is_empty()).map(str::to_string)
    }

    pub fn all(&self, name: &str) -> Vec<String> {
        self.pairs.iter().filter(|(k, _)| k == name).map(|(_, v)| v.clone()).collect()
    }

    pub fn checked(&self, name: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == name)
    }
}

impl FromRequest for Form {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Form, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = Body::from_request(req, payload);
        Box::pin(async move { Ok(Form::parse(&body.await?)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_repeated_and_encoded_fields() {
        let form = Form::parse(b"flag=pii_detection&flag=secrets_detection&name=%3Cb%3E+x&empty=");
        assert_eq!(form.all("flag"), vec!["pii_detection", "secrets_detection"]);
        assert_eq!(form.get("name"), "<b> x");
        assert_eq!(form.text("empty"), None);
        assert!(form.checked("empty"));
        assert!(!form.checked("missing"));
        assert_eq!(form.get("missing"), "");
    }
}
