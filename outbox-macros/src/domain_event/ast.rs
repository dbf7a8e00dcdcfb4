//! The typed input of the derive: container and field attributes, serde renames applied.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, LitInt, LitStr, Token, Type};

use crate::diagnostics::Errors;

/// One older version and the type its payload decodes into.
pub struct Upcast {
    pub version: u32,
    pub key: Ident,
    pub ty: Type,
}

/// One serialized field.
pub struct Field<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    /// The JSON name after serde renames.
    pub json_name: String,
    pub aggregate_id: Option<Span>,
    pub skipped: bool,
}

/// The whole derive input.
pub struct Event<'a> {
    pub ident: &'a Ident,
    pub generics: &'a syn::Generics,
    pub name: Option<LitStr>,
    pub version: Option<LitInt>,
    pub aggregate: Option<LitStr>,
    pub upcasts: Vec<Upcast>,
    pub upcast_span: Option<Span>,
    pub fields: Vec<Field<'a>>,
    /// Where to point errors about the container.
    pub attr_span: Span,
}

const KEYS: &str = "`name`, `version`, `aggregate`, `upcast_from`";

impl<'a> Event<'a> {
    pub fn from_syn(input: &'a DeriveInput) -> syn::Result<Self> {
        let mut errors = Errors::default();
        let Data::Struct(data) = &input.data else {
            return Err(syn::Error::new_spanned(
                &input.ident,
                "`DomainEvent` can only be derived for a struct with named fields (an event is a payload snapshot)",
            ));
        };
        let Fields::Named(named) = &data.fields else {
            return Err(syn::Error::new_spanned(
                &input.ident,
                "`DomainEvent` needs named fields: they become the JSON payload's keys",
            ));
        };
        let mut event = Event {
            ident: &input.ident,
            generics: &input.generics,
            name: None,
            version: None,
            aggregate: None,
            upcasts: Vec::new(),
            upcast_span: None,
            fields: Vec::new(),
            attr_span: input.ident.span(),
        };
        let mut seen_attr = false;
        let mut rename_all: Option<String> = None;
        for attr in &input.attrs {
            if attr.path().is_ident("domain_event") {
                seen_attr = true;
                event.attr_span = attr.span();
                if let Err(e) = parse_container(attr, &mut event, &mut errors) {
                    errors.push(e);
                }
            } else if attr.path().is_ident("serde") {
                let _ = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("rename_all") {
                        let value: LitStr = meta.value()?.parse()?;
                        rename_all = Some(value.value());
                    } else {
                        skip_value(&meta)?;
                    }
                    Ok(())
                });
            }
        }
        if !seen_attr {
            errors.at(
                &input.ident,
                "missing `#[domain_event(name = \"...\", version = N, aggregate = \"...\")]` on the struct",
            );
        }
        for field in &named.named {
            let Some(ident) = &field.ident else { continue };
            let mut parsed = Field {
                ident,
                ty: &field.ty,
                json_name: apply_rename_all(&ident.to_string(), rename_all.as_deref()),
                aggregate_id: None,
                skipped: false,
            };
            for attr in &field.attrs {
                if attr.path().is_ident("aggregate_id") {
                    if let Err(e) = attr.meta.require_path_only() {
                        errors.push(syn::Error::new(e.span(), "`#[aggregate_id]` takes no arguments"));
                    }
                    parsed.aggregate_id = Some(attr.span());
                } else if attr.path().is_ident("serde") {
                    let _ = attr.parse_nested_meta(|meta| {
                        if meta.path.is_ident("rename") {
                            let value: LitStr = meta.value()?.parse()?;
                            parsed.json_name = value.value();
                        } else if meta.path.is_ident("skip") || meta.path.is_ident("skip_serializing") {
                            parsed.skipped = true;
                        } else {
                            skip_value(&meta)?;
                        }
                        Ok(())
                    });
                }
            }
            event.fields.push(parsed);
        }
        errors.finish()?;
        Ok(event)
    }
}

fn parse_container(attr: &syn::Attribute, event: &mut Event<'_>, errors: &mut Errors) -> syn::Result<()> {
    attr.parse_nested_meta(|meta| {
        let key = meta.path.get_ident().map(Ident::to_string).unwrap_or_default();
        match key.as_str() {
            "name" => event.name = Some(meta.value()?.parse()?),
            "version" => event.version = Some(meta.value()?.parse()?),
            "aggregate" => event.aggregate = Some(meta.value()?.parse()?),
            "upcast_from" => {
                event.upcast_span = Some(meta.path.span());
                meta.parse_nested_meta(|inner| {
                    let key = inner.path.require_ident()?.clone();
                    let version =
                        key.to_string().strip_prefix('v').and_then(|n| n.parse::<u32>().ok()).ok_or_else(|| {
                            syn::Error::new(key.span(), "expected a version key like `v1 = OrderPlacedV1`")
                        })?;
                    let ty: Type = inner.value()?.parse()?;
                    event.upcasts.push(Upcast { version, key, ty });
                    Ok(())
                })?;
            }
            _ => {
                errors.push(meta.error(format!(
                    "unknown key `{}`; expected one of {KEYS}",
                    meta.path.get_ident().map(Ident::to_string).unwrap_or_else(|| "?".into())
                )));
                // Skip the value so the remaining keys are still checked.
                skip_value(&meta)?;
            }
        }
        Ok(())
    })
}

/// Consumes the value of a key this macro does not read (`key = value` or `key(...)`).
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _content;
        syn::parenthesized!(_content in meta.input);
    }
    Ok(())
}

/// serde's `rename_all` rules for field names (which start in snake_case).
fn apply_rename_all(field: &str, rule: Option<&str>) -> String {
    let words: Vec<&str> = field.split('_').filter(|w| !w.is_empty()).collect();
    let capitalize = |w: &str| {
        let mut chars = w.chars();
        chars.next().map(|c| c.to_uppercase().chain(chars).collect::<String>()).unwrap_or_default()
    };
    match rule {
        Some("lowercase") => field.to_lowercase(),
        Some("UPPERCASE") => field.to_uppercase(),
        Some("PascalCase") => words.iter().map(|w| capitalize(w)).collect(),
        Some("camelCase") => {
            words.iter().enumerate().map(|(i, w)| if i == 0 { (*w).to_owned() } else { capitalize(w) }).collect()
        }
        Some("SCREAMING_SNAKE_CASE") => field.to_uppercase(),
        Some("kebab-case") => words.join("-"),
        Some("SCREAMING-KEBAB-CASE") => words.join("-").to_uppercase(),
        _ => field.to_owned(),
    }
}
