use std::collections::BTreeSet;

use serde_json::Value;
use utoipa::PartialSchema;

use super::*;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::services::{auth, completion, imagine, markdown};

/// Every error kind. The match fails to compile when a kind is added, until it is listed here.
fn every_kind() -> Vec<ErrorKind> {
    use ErrorKind as K;
    let listed = vec![
        K::InvalidRequest,
        K::InvalidCredentials,
        K::SessionExpired,
        K::InsufficientFunds,
        K::GatewayError,
        K::Overloaded,
        K::RateLimited,
        K::NotFound,
        K::PayloadTooLarge,
        K::RequestTimeout,
        K::UnsupportedMediaType,
        K::MethodNotAllowed,
        K::InternalError,
    ];
    for kind in &listed {
        match kind {
            K::InvalidRequest
            | K::InvalidCredentials
            | K::SessionExpired
            | K::InsufficientFunds
            | K::GatewayError
            | K::Overloaded
            | K::RateLimited
            | K::NotFound
            | K::PayloadTooLarge
            | K::RequestTimeout
            | K::UnsupportedMediaType
            | K::MethodNotAllowed
            | K::InternalError => {}
        }
    }
    listed
}

fn enum_of(schema: impl serde::Serialize) -> BTreeSet<String> {
    let v = serde_json::to_value(schema).unwrap();
    v["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("not an enum schema: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_error_type_enums_are_what_the_errors_say() {
    let spec: BTreeSet<String> = every_kind()
        .into_iter()
        .map(|k| k.type_name().to_string())
        .collect();
    assert_eq!(enum_of(ErrorType::schema()), spec);
    let openai: BTreeSet<String> = every_kind()
        .into_iter()
        .map(|k| {
            let body = OpenAiError(ApiError::new(k, "x")).body();
            body["error"]["type"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(enum_of(OpenAiErrorType::schema()), openai);
}

/// The four listeners' documents as they are served.
fn documents() -> Vec<(&'static str, Value)> {
    [
        ("auth", auth::openapi::document()),
        ("completion", completion::openapi::document()),
        ("markdown", markdown::openapi::document()),
        ("imagine", imagine::openapi::document()),
    ]
    .into_iter()
    .map(|(name, doc)| {
        let doc = finish(doc, "http://127.0.0.1:8080");
        (name, serde_json::to_value(&doc).unwrap())
    })
    .collect()
}

fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r);
            }
            map.values().for_each(|v| refs(v, out));
        }
        Value::Array(list) => list.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn every_document_is_3_1_with_unique_operation_ids_and_references_that_resolve() {
    for (name, doc) in documents() {
        assert!(
            doc["openapi"].as_str().unwrap().starts_with("3.1."),
            "{name}"
        );
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"), "{name}");
        assert_eq!(doc["servers"][0]["url"], "http://127.0.0.1:8080", "{name}");
        let mut ids = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap_or_else(|| {
                    panic!("{name}: {method} {path} has no operationId");
                });
                assert!(ids.insert(id.to_string()), "{name}: operationId {id} twice");
            }
        }
        for path in ["/", "/ui", "/metrics", "/openapi.json"] {
            assert!(doc["paths"].get(path).is_some(), "{name} lacks {path}");
        }
        let mut found = Vec::new();
        refs(&doc, &mut found);
        for r in found {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{name}: {r}"));
            assert!(
                doc.pointer(pointer).is_some(),
                "{name}: {r} does not resolve"
            );
        }
    }
}

#[test]
fn the_bearer_scheme_guards_the_routes_that_take_a_key_and_no_other() {
    // Ollama's routes that spend take the key as a bearer header too; its model routes do not.
    let ollama = ["/api/chat", "/api/generate", "/api/embed"];
    for (name, doc) in documents() {
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let bearer = op["security"]
                    .as_array()
                    .is_some_and(|list| list.iter().any(|r| r.get(BEARER).is_some()));
                let needs_key = (path.starts_with("/v1/") || ollama.contains(&path.as_str()))
                    && method == "post";
                assert_eq!(bearer, needs_key, "{name}: {method} {path}");
            }
        }
        let scheme = &doc["components"]["securitySchemes"][BEARER];
        if matches!(name, "completion" | "imagine") {
            assert_eq!(scheme["type"], "http", "{name}");
            assert_eq!(scheme["scheme"], "bearer", "{name}");
        } else {
            assert!(scheme.is_null(), "{name}");
        }
    }
}
