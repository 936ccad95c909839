//! HTTP plumbing shared by every handler: the body type, replies, query parameters.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::status::ApiError;

pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// A response before it becomes HTTP.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Body,
    pub(crate) resource_version: Option<u64>,
    pub(crate) retry_after: Option<u64>,
    /// `Warning` headers (`299 - "<text>"`), e.g. unknown fields under `fieldValidation=Warn`.
    pub(crate) warnings: Vec<String>,
}

impl Reply {
    pub(crate) fn json(status: u16, value: &Value) -> Reply {
        Reply::bytes(
            status,
            Bytes::from(serde_json::to_vec(value).expect("JSON values serialise")),
        )
    }

    pub(crate) fn bytes(status: u16, bytes: Bytes) -> Reply {
        Reply {
            status,
            body: full(bytes),
            resource_version: None,
            retry_after: None,
            warnings: Vec::new(),
        }
    }

    pub(crate) fn error(error: &ApiError) -> Reply {
        let mut reply = Reply::json(error.code, &error.to_status());
        reply.retry_after = error.retry_after_seconds;
        reply
    }

    /// The same answer with its object reduced to a `PartialObjectMetadata` (kind, apiVersion, metadata).
    pub(crate) async fn metadata_only(mut self) -> Reply {
        let body = std::mem::replace(&mut self.body, full(Bytes::new()));
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => return Reply::error(&ApiError::internal(format!("the answer broke off: {error}"))),
        };
        let object: Value = match serde_json::from_slice(&bytes) {
            Ok(object) => object,
            Err(error) => {
                return Reply::error(&ApiError::internal(format!("the answer is not JSON: {error}")));
            }
        };
        let partial = serde_json::json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        });
        self.body = full(Bytes::from(
            serde_json::to_vec(&partial).expect("JSON values serialise"),
        ));
        self
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let mut response = Response::new(self.body);
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        for warning in &self.warnings {
            let quoted = warning.replace('\\', "\\\\").replace('"', "\\\"");
            if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
                response.headers_mut().append(http::header::WARNING, value);
            }
        }
        response
    }
}

pub(crate) fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// Query parameters, percent-decoded.
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(raw: &str) -> Query {
        Query(
            raw.split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (percent_decode(key), percent_decode(value))
                })
                .collect(),
        )
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("1" | "true" | "True"))
    }
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        index += 3;
                    }
                    None => {
                        out.push(b'%');
                        index += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                index += 1;
            }
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing_decodes_percent_escapes() {
        let query = Query::parse("labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&empty=");
        assert_eq!(query.get("labelSelector"), Some("app=web,tier in (a)"));
        assert!(query.flag("watch"));
        assert_eq!(query.get("empty"), Some(""));
        assert_eq!(percent_decode("system%3A%3Aleader"), "system::leader");
        assert_eq!(percent_decode("bad%zz%"), "bad%zz%");
    }
}
