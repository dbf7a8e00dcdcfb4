//! Semantic checks of a parsed derive input; every problem is reported in one compile.

use super::ast::Event;
use crate::diagnostics::Errors;

pub fn check(event: &Event<'_>) -> syn::Result<()> {
    let mut errors = Errors::default();
    let attr = event.attr_span;
    match &event.name {
        None => {
            errors.push(syn::Error::new(attr, "missing `name = \"...\"`: the stable event name, e.g. `order.placed`"))
        }
        Some(name) => {
            let value = name.value();
            let valid = !value.is_empty()
                && value.len() <= 128
                && value.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c));
            if !valid {
                errors.at(
                    name,
                    format!(
                        "invalid event name {value:?}: use lowercase letters, digits, `.`, `-`, `_` (at most 128), e.g. \"order.placed\"; never a Rust path"
                    ),
                );
            }
        }
    }
    let version = match &event.version {
        None => {
            errors.push(syn::Error::new(attr, "missing `version = N`: the payload schema version, starting at 1"));
            None
        }
        Some(lit) => match lit.base10_parse::<u32>() {
            Ok(v) if (1..=i32::MAX as u32).contains(&v) => Some(v),
            _ => {
                errors.at(lit, "`version` must be a whole number from 1");
                None
            }
        },
    };
    match &event.aggregate {
        None => errors.push(syn::Error::new(attr, "missing `aggregate = \"...\"`: the aggregate type, e.g. `order`")),
        Some(lit) if lit.value().trim().is_empty() || lit.value().len() > 64 => {
            errors.at(lit, "`aggregate` must be a non-empty name of at most 64 bytes")
        }
        Some(_) => {}
    }
    let ids: Vec<_> = event.fields.iter().filter(|f| f.aggregate_id.is_some()).collect();
    match ids.as_slice() {
        [] => errors.at(event.ident, "no `#[aggregate_id]` field: mark the field that holds the aggregate's id"),
        [_] => {}
        [_, rest @ ..] => {
            for field in rest {
                errors.push(syn::Error::new(field.span(), "only one field can be `#[aggregate_id]`"));
            }
        }
    }
    if let Some(version) = version {
        let mut listed: Vec<u32> = Vec::new();
        for upcast in &event.upcasts {
            if upcast.version == 0 || upcast.version >= version {
                errors.at(
                    &upcast.key,
                    format!("`{}` is not an older version: upcasters are for v1 to v{}", upcast.key, version - 1),
                );
            } else if listed.contains(&upcast.version) {
                errors.at(&upcast.key, format!("`{}` is listed twice", upcast.key));
            } else {
                listed.push(upcast.version);
            }
        }
        if let Some(&oldest) = listed.iter().min() {
            for missing in (oldest..version).filter(|v| !listed.contains(v)) {
                let span = event.upcast_span.unwrap_or(attr);
                errors.push(syn::Error::new(
                    span,
                    format!(
                        "missing upcaster for v{missing}: the chain from v{oldest} to v{version} needs `v{missing} = TypeV{missing}` in `upcast_from(...)`"
                    ),
                ));
            }
        }
    }
    errors.finish()
}
