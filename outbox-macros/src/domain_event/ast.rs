//! The typed input of the derives: container, variant and field attributes, serde renames applied.

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, LitInt, LitStr, Token, Type};

use crate::diagnostics::Errors;

/// One older version and the type its payload decodes into.
pub struct Upcast {
    pub version: u32,
    pub key: Ident,
    pub ty: Type,
}

/// One field of a struct or of an enum variant.
pub struct Field<'a> {
    /// `None` for a tuple field.
    pub ident: Option<&'a Ident>,
    pub ty: &'a Type,
    /// The JSON name after serde renames; the position for a tuple field.
    pub json_name: String,
    pub aggregate_id: Option<Span>,
    pub skipped: bool,
    /// Locked by its type name only: `#[payload_schema(by_name)]`, a custom serde `with` /
    /// `serialize_with` (the type's own fields are then not what the JSON holds), or a type that holds the
    /// container itself (`children: Vec<Node>` in `Node`, whose fields are locked one level up already).
    pub by_name: bool,
}

impl Field<'_> {
    /// Where to point an error about this field.
    pub fn span(&self) -> Span {
        self.ident.map_or_else(|| self.ty.span(), Ident::span)
    }
}

/// The fields of a struct or of a variant.
pub enum Shape<'a> {
    Named(Vec<Field<'a>>),
    Tuple(Vec<Field<'a>>),
    Unit,
}

impl<'a> Shape<'a> {
    /// The serialized fields.
    pub fn fields(&self) -> impl Iterator<Item = &Field<'a>> {
        let all: &[Field<'a>] = match self {
            Shape::Named(fields) | Shape::Tuple(fields) => fields,
            Shape::Unit => &[],
        };
        all.iter().filter(|f| !f.skipped)
    }
}

/// One enum variant.
pub struct Variant<'a> {
    /// The JSON name after serde renames.
    pub json_name: String,
    pub shape: Shape<'a>,
    pub skipped: bool,
}

/// A `#[derive(PayloadSchema)]` input.
pub enum Body<'a> {
    Struct(Shape<'a>),
    Enum(Vec<Variant<'a>>),
}

/// The input of `#[derive(PayloadSchema)]`.
pub struct Payload<'a> {
    pub ident: &'a Ident,
    pub generics: &'a syn::Generics,
    pub body: Body<'a>,
}

/// The input of `#[derive(DomainEvent)]`.
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
        let Fields::Named(_) = &data.fields else {
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
        for attr in &input.attrs {
            if attr.path().is_ident("domain_event") {
                seen_attr = true;
                event.attr_span = attr.span();
                if let Err(e) = parse_container(attr, &mut event, &mut errors) {
                    errors.push(e);
                }
            }
        }
        if !seen_attr {
            errors.at(
                &input.ident,
                "missing `#[domain_event(name = \"...\", version = N, aggregate = \"...\")]` on the struct",
            );
        }
        let serde = SerdeContainer::from_attrs(&input.attrs);
        event.fields = parse_fields(&input.ident, &data.fields, serde.rename_all.as_deref(), true, &mut errors);
        errors.finish()?;
        Ok(event)
    }
}

impl<'a> Payload<'a> {
    pub fn from_syn(input: &'a DeriveInput) -> syn::Result<Self> {
        let mut errors = Errors::default();
        let serde = SerdeContainer::from_attrs(&input.attrs);
        let body = match &input.data {
            Data::Struct(data) => {
                Body::Struct(shape(&input.ident, &data.fields, serde.rename_all.as_deref(), &mut errors))
            }
            Data::Enum(data) => Body::Enum(
                data.variants
                    .iter()
                    .map(|variant| {
                        let attrs = SerdeVariant::from_attrs(&variant.attrs);
                        let rename_fields = attrs.rename_all.as_deref().or(serde.rename_all_fields.as_deref());
                        Variant {
                            json_name: attrs.rename.unwrap_or_else(|| {
                                apply_rename_to_variant(&variant.ident.to_string(), serde.rename_all.as_deref())
                            }),
                            shape: shape(&input.ident, &variant.fields, rename_fields, &mut errors),
                            skipped: attrs.skipped,
                        }
                    })
                    .collect(),
            ),
            Data::Union(_) => {
                return Err(syn::Error::new_spanned(
                    &input.ident,
                    "`PayloadSchema` can only be derived for a struct or an enum (the types serde serializes)",
                ));
            }
        };
        errors.finish()?;
        Ok(Payload { ident: &input.ident, generics: &input.generics, body })
    }
}

fn shape<'a>(container: &Ident, fields: &'a Fields, rename_all: Option<&str>, errors: &mut Errors) -> Shape<'a> {
    match fields {
        Fields::Named(_) => Shape::Named(parse_fields(container, fields, rename_all, false, errors)),
        Fields::Unnamed(_) => Shape::Tuple(parse_fields(container, fields, rename_all, false, errors)),
        Fields::Unit => Shape::Unit,
    }
}

/// The fields with their serde names; `aggregate_id` is read for `DomainEvent` only (elsewhere it is not a
/// registered attribute, so rustc reports it).
fn parse_fields<'a>(
    container: &Ident,
    fields: &'a Fields,
    rename_all: Option<&str>,
    event: bool,
    errors: &mut Errors,
) -> Vec<Field<'a>> {
    let mut parsed = Vec::new();
    let mut position = 0;
    for field in fields {
        let mut next = Field {
            ident: field.ident.as_ref(),
            ty: &field.ty,
            json_name: match &field.ident {
                Some(ident) => apply_rename_to_field(&ident.unraw().to_string(), rename_all),
                None => String::new(),
            },
            aggregate_id: None,
            skipped: false,
            // Its schema would contain itself: a `const` cycle.
            by_name: mentions(field.ty.to_token_stream(), container),
        };
        for attr in &field.attrs {
            if event && attr.path().is_ident("aggregate_id") {
                if let Err(e) = attr.meta.require_path_only() {
                    errors.push(syn::Error::new(e.span(), "`#[aggregate_id]` takes no arguments"));
                }
                next.aggregate_id = Some(attr.span());
            } else if attr.path().is_ident("payload_schema") {
                let parsed = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("by_name") {
                        next.by_name = true;
                        Ok(())
                    } else {
                        let key = meta.path.get_ident().map_or_else(|| "?".to_owned(), Ident::to_string);
                        Err(meta.error(format!(
                            "unknown key `{key}`; expected `by_name` (lock this field by its type name only)"
                        )))
                    }
                });
                if let Err(e) = parsed {
                    errors.push(e);
                }
            } else if attr.path().is_ident("serde") {
                let _ = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("rename") {
                        if let Some(name) = serialize_name(&meta)? {
                            next.json_name = name;
                        }
                    } else if meta.path.is_ident("skip") || meta.path.is_ident("skip_serializing") {
                        next.skipped = true;
                    } else if meta.path.is_ident("with") || meta.path.is_ident("serialize_with") {
                        next.by_name = true;
                        skip_value(&meta)?;
                    } else {
                        skip_value(&meta)?;
                    }
                    Ok(())
                });
            }
        }
        if !next.skipped {
            if next.ident.is_none() {
                next.json_name = position.to_string();
            }
            position += 1;
        }
        parsed.push(next);
    }
    parsed
}

/// Whether `tokens` name `container` (or `Self`).
fn mentions(tokens: proc_macro2::TokenStream, container: &Ident) -> bool {
    tokens.into_iter().any(|tree| match tree {
        proc_macro2::TokenTree::Ident(ident) => ident == *container || ident == "Self",
        proc_macro2::TokenTree::Group(group) => mentions(group.stream(), container),
        _ => false,
    })
}

/// The serde attributes of a struct or enum that change JSON names.
#[derive(Default)]
struct SerdeContainer {
    rename_all: Option<String>,
    rename_all_fields: Option<String>,
}

impl SerdeContainer {
    fn from_attrs(attrs: &[syn::Attribute]) -> Self {
        let mut serde = SerdeContainer::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
            let _ = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename_all") {
                    serde.rename_all = serialize_name(&meta)?;
                } else if meta.path.is_ident("rename_all_fields") {
                    serde.rename_all_fields = serialize_name(&meta)?;
                } else {
                    skip_value(&meta)?;
                }
                Ok(())
            });
        }
        serde
    }
}

/// The serde attributes of a variant that matter here.
#[derive(Default)]
struct SerdeVariant {
    rename: Option<String>,
    rename_all: Option<String>,
    skipped: bool,
}

impl SerdeVariant {
    fn from_attrs(attrs: &[syn::Attribute]) -> Self {
        let mut serde = SerdeVariant::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
            let _ = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    serde.rename = serialize_name(&meta)?;
                } else if meta.path.is_ident("rename_all") {
                    serde.rename_all = serialize_name(&meta)?;
                } else if meta.path.is_ident("skip") || meta.path.is_ident("skip_serializing") {
                    serde.skipped = true;
                } else {
                    skip_value(&meta)?;
                }
                Ok(())
            });
        }
        serde
    }
}

/// The serialized name of `rename = "..."` or `rename(serialize = "...", deserialize = "...")`.
fn serialize_name(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
    if meta.input.peek(Token![=]) {
        let value: LitStr = meta.value()?.parse()?;
        return Ok(Some(value.value()));
    }
    let mut name = None;
    meta.parse_nested_meta(|inner| {
        if inner.path.is_ident("serialize") {
            let value: LitStr = inner.value()?.parse()?;
            name = Some(value.value());
        } else {
            skip_value(&inner)?;
        }
        Ok(())
    })?;
    Ok(name)
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
fn apply_rename_to_field(field: &str, rule: Option<&str>) -> String {
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

/// serde's `rename_all` rules for variant names (which start in PascalCase).
fn apply_rename_to_variant(variant: &str, rule: Option<&str>) -> String {
    let snake = || {
        let mut out = String::new();
        for (i, c) in variant.char_indices() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        }
        out
    };
    match rule {
        Some("lowercase") => variant.to_lowercase(),
        Some("UPPERCASE") => variant.to_uppercase(),
        Some("camelCase") => {
            let mut chars = variant.chars();
            chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
        }
        Some("snake_case") => snake(),
        Some("SCREAMING_SNAKE_CASE") => snake().to_uppercase(),
        Some("kebab-case") => snake().replace('_', "-"),
        Some("SCREAMING-KEBAB-CASE") => snake().replace('_', "-").to_uppercase(),
        _ => variant.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_follow_serde() {
        let cases = [
            ("snake_case", "order_placed"),
            ("SCREAMING_SNAKE_CASE", "ORDER_PLACED"),
            ("kebab-case", "order-placed"),
            ("camelCase", "orderPlaced"),
            ("lowercase", "orderplaced"),
        ];
        for (rule, expected) in cases {
            assert_eq!(apply_rename_to_variant("OrderPlaced", Some(rule)), expected, "{rule}");
        }
        assert_eq!(apply_rename_to_variant("OrderPlaced", None), "OrderPlaced");
    }
}
