//! Typed views over HTTP: `GET /views/{view}/schema`, the JSON Schema of one value of a view,
//! and [`typed_document`], the OpenAPI document with each typed view's schema in its routes.
//!
//! A view's schema is its runtime's now: a deploy that changes it is seen here from the
//! deploy's position on.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::access::Caller;
use super::views::reading_query;
use super::{ApiError, AppState};
use crate::hub::narrow::Narrow;
use crate::schema::ViewSchema;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/views/{view}/schema", get(view_schema))
}

/// `GET /views/{view}/schema`: `application/schema+json`; `404 not_found` for a view no runtime
/// declares, `404 no_schema` for an untyped one. Read access is the view's: any grant of it,
/// narrowed or not.
async fn view_schema(
    State(state): State<AppState>,
    view: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(view) = view?;
    let query = reading_query(&state, query.as_deref(), &[])?;
    let caller = Caller::of(&state, &headers, query.get("access_token"))?;
    if caller.grants(&view).is_empty() {
        caller.read(&view, Narrow::All)?;
    }
    let (_, runtime) = state
        .runtimes
        .iter()
        .find(|(_, runtime)| runtime.handle.views().contains(&view))
        .ok_or_else(|| ApiError::not_found(format!("no view named {view:?}")))?;
    let schemas = runtime.handle.schemas();
    let schema = schemas.get(&view).ok_or_else(|| {
        ApiError::not_found_as(
            "no_schema",
            format!("view {view:?} is untyped: its runtime declares no schema for it"),
        )
    })?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/schema+json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Json(schema.document()),
    )
        .into_response())
}

/// `document` (the OpenAPI description of every route) with, for each typed view `V`, its
/// schema as the component `view.V` (its `$defs` lifted beside it as `view.V.NAME`, references
/// rewritten, `$schema` dropped) and the routes that carry its values described for `V` alone:
/// `/views/V` (entries of that schema) and `/views/V/events` (`update` and `state` events whose
/// value has it).
pub fn typed_document<'a>(
    mut document: Value,
    typed: impl IntoIterator<Item = (&'a str, &'a ViewSchema)>,
) -> Value {
    for (view, schema) in typed {
        let base = format!("view.{}", component_name(view));
        let Some(components) = document
            .pointer_mut("/components/schemas")
            .and_then(Value::as_object_mut)
        else {
            return document;
        };
        lift(components, &base, schema.document());
        let value = json!({ "$ref": format!("#/components/schemas/{base}") });
        for event in ["UpdateEvent", "StateEvent"] {
            let mut typed = components.get(event).cloned().unwrap_or(Value::Null);
            if let Some(slot) = typed.pointer_mut("/properties/data/contentSchema/properties/value")
            {
                *slot = value.clone();
            }
            components.insert(format!("{base}.{event}"), typed);
        }
        let mut state = components.get("ViewState").cloned().unwrap_or(Value::Null);
        if let Some(slot) = state.pointer_mut("/properties/entries/additionalProperties") {
            *slot = value.clone();
        }
        components.insert(format!("{base}.ViewState"), state);
        let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
            return document;
        };
        for (template, suffix) in [("/views/{view}", ""), ("/views/{view}/events", "/events")] {
            if let Some(item) = paths.get(template) {
                let item = for_view(item.clone(), view, &base);
                paths.insert(format!("/views/{view}{suffix}"), item);
            }
        }
    }
    document
}

/// A path item of the `{view}` routes, for `view` alone: no `view` parameter, operation ids
/// and links of its own, and references to the generic schemas turned to the view's.
fn for_view(mut item: Value, view: &str, base: &str) -> Value {
    for operation in item
        .as_object_mut()
        .into_iter()
        .flat_map(|o| o.values_mut())
    {
        if let Some(id) = operation.get_mut("operationId") {
            *id = json!(format!("{}.{view}", id.as_str().unwrap_or_default()));
        }
        if let Some(parameters) = operation
            .get_mut("parameters")
            .and_then(Value::as_array_mut)
        {
            parameters.retain(|p| !(p["name"] == "view" && p["in"] == "path"));
        }
        let responses = operation.get_mut("responses");
        for link in responses
            .into_iter()
            .filter_map(Value::as_object_mut)
            .flat_map(|r| r.values_mut())
            .filter_map(|r| r.get_mut("links").and_then(Value::as_object_mut))
            .flat_map(|links| links.values_mut())
        {
            if let Some(id) = link.get_mut("operationId") {
                *id = json!(format!("{}.{view}", id.as_str().unwrap_or_default()));
            }
            if let Some(parameters) = link.get_mut("parameters").and_then(Value::as_object_mut) {
                parameters.remove("view");
            }
        }
    }
    retarget(&mut item, &|reference| {
        let name = reference.strip_prefix("#/components/schemas/")?;
        ["UpdateEvent", "StateEvent", "ViewState"]
            .contains(&name)
            .then(|| format!("#/components/schemas/{base}.{name}"))
    });
    item
}

/// Puts `schema` into `components` as `base`, each of its `$defs` as `base.NAME`.
fn lift(components: &mut Map<String, Value>, base: &str, schema: &Value) {
    let mut schema = schema.clone();
    let defs = schema
        .as_object_mut()
        .map(|object| {
            object.remove("$schema");
            object.remove("$defs")
        })
        .unwrap_or_default();
    let rewrite = |reference: &str| {
        if reference == "#" {
            return Some(format!("#/components/schemas/{base}"));
        }
        let rest = reference.strip_prefix("#/$defs/")?;
        let (name, tail) = rest.split_once('/').map_or((rest, ""), |(n, t)| (n, t));
        let tail = if tail.is_empty() {
            String::new()
        } else {
            format!("/{tail}")
        };
        Some(format!(
            "#/components/schemas/{base}.{}{tail}",
            component_name(name)
        ))
    };
    retarget(&mut schema, &rewrite);
    components.insert(base.to_owned(), schema);
    if let Some(Value::Object(defs)) = defs {
        for (name, mut def) in defs {
            retarget(&mut def, &rewrite);
            components.insert(format!("{base}.{}", component_name(&name)), def);
        }
    }
}

/// Rewrites every `$ref` in `value` that `rewrite` maps.
fn retarget(value: &mut Value, rewrite: &dyn Fn(&str) -> Option<String>) {
    match value {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                match value {
                    Value::String(reference) if key == "$ref" => {
                        if let Some(to) = rewrite(reference) {
                            *reference = to;
                        }
                    }
                    value => retarget(value, rewrite),
                }
            }
        }
        Value::Array(values) => values.iter_mut().for_each(|v| retarget(v, rewrite)),
        _ => {}
    }
}

/// `name` with what a component name may not hold (`^[A-Za-z0-9._-]+$`) turned to `_`.
fn component_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price() -> ViewSchema {
        ViewSchema::new(
            "prices",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "required": ["price", "venue"],
                "properties": {
                    "price": { "type": "integer" },
                    "venue": { "$ref": "#/$defs/Venue" },
                },
                "$defs": { "Venue": { "enum": ["XNYS", "XLON"] } },
            }),
        )
        .unwrap()
    }

    #[test]
    fn a_typed_view_gets_its_component_and_routes() {
        let base: Value = serde_json::from_str(super::super::openapi::DOCUMENT).unwrap();
        let schema = price();
        let document = typed_document(base.clone(), [("prices", &schema)]);
        let components = &document["components"]["schemas"];
        assert_eq!(
            components["view.prices"]["properties"]["venue"]["$ref"],
            "#/components/schemas/view.prices.Venue"
        );
        assert!(components["view.prices"].get("$schema").is_none());
        assert!(components["view.prices"].get("$defs").is_none());
        assert_eq!(
            components["view.prices.Venue"]["enum"],
            json!(["XNYS", "XLON"])
        );
        let value = json!({ "$ref": "#/components/schemas/view.prices" });
        assert_eq!(
            components["view.prices.UpdateEvent"]["properties"]["data"]["contentSchema"]
                ["properties"]["value"],
            value
        );
        assert_eq!(
            components["view.prices.ViewState"]["properties"]["entries"]["additionalProperties"],
            value
        );

        let events = &document["paths"]["/views/prices/events"]["get"];
        assert_eq!(events["operationId"], "viewEvents.prices");
        let text = events.to_string();
        assert!(
            text.contains("view.prices.UpdateEvent") && text.contains("view.prices.StateEvent")
        );
        assert!(!text.contains("\"#/components/schemas/UpdateEvent\""));
        assert!(!events["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "view"));
        let state = &document["paths"]["/views/prices"]["get"];
        assert_eq!(state["operationId"], "viewState.prices");
        let link = &state["responses"]["200"]["links"]["eventsAfter"];
        assert_eq!(link["operationId"], "viewEvents.prices");
        assert!(link["parameters"].get("view").is_none());
        // The generic routes stay as they were.
        assert_eq!(
            document["paths"]["/views/{view}"],
            base["paths"]["/views/{view}"]
        );
        // Untyped: the document as it is.
        assert_eq!(typed_document(base.clone(), []), base);
    }

    #[test]
    fn a_recursive_schema_refers_to_its_component() {
        let base: Value = serde_json::from_str(super::super::openapi::DOCUMENT).unwrap();
        let tree = ViewSchema::new(
            "trees",
            json!({ "type": "object", "properties": { "kids": { "type": "array", "items": { "$ref": "#" } } } }),
        )
        .unwrap();
        let document = typed_document(base, [("trees", &tree)]);
        assert_eq!(
            document["components"]["schemas"]["view.trees"]["properties"]["kids"]["items"]["$ref"],
            "#/components/schemas/view.trees"
        );
    }
}
