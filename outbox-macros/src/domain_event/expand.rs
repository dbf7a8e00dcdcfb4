//! Code generation for `#[derive(DomainEvent)]` and `#[derive(PayloadSchema)]`.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use super::ast::{Body, Event, Field, Payload, Shape};
use super::lock::{Lock, type_string};
use crate::schema_lock::LockedNode;

/// The `FieldSchema` of each serialized field; a field's nested fields come from its type's
/// `PayloadSchema` impl, which is required (spanned at the type) unless the field is locked by name.
fn field_schemas<'a>(private: &TokenStream, fields: impl Iterator<Item = &'a Field<'a>>) -> Vec<TokenStream> {
    fields
        .map(|field| {
            let json = &field.json_name;
            let ty_string = type_string(field.ty);
            let nested = nested_fields(private, field);
            quote!(#private::FieldSchema { name: #json, ty: #ty_string, fields: #nested })
        })
        .collect()
}

fn nested_fields(private: &TokenStream, field: &Field<'_>) -> TokenStream {
    let ty = field.ty;
    if field.by_name { quote!(&[]) } else { quote_spanned!(ty.span()=> <#ty as #private::PayloadSchema>::FIELDS) }
}

/// `where` clauses with `T: PayloadSchema` for every type parameter.
fn with_schema_bounds(private: &TokenStream, generics: &syn::Generics) -> syn::Generics {
    let mut generics = generics.clone();
    let params: Vec<_> = generics.type_params().map(|p| p.ident.clone()).collect();
    let clause = generics.make_where_clause();
    for param in params {
        clause.predicates.push(syn::parse_quote!(#param: #private::PayloadSchema));
    }
    generics
}

/// `impl PayloadSchema` whose `FIELDS` is `fields` (an expression of type `&'static [FieldSchema]`).
fn payload_impl(
    private: &TokenStream,
    ident: &syn::Ident,
    generics: &syn::Generics,
    fields: TokenStream,
) -> TokenStream {
    let generics = with_schema_bounds(private, generics);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics #private::PayloadSchema for #ident #ty_generics #where_clause {
            const FIELDS: &'static [#private::FieldSchema] = #fields;
        }
    }
}

pub fn expand_payload(payload: &Payload<'_>) -> TokenStream {
    let private = crate::paths::derive_private();
    let fields = match &payload.body {
        Body::Struct(shape) => {
            let fields = field_schemas(&private, shape.fields());
            quote!(&[#(#fields),*])
        }
        Body::Enum(variants) => {
            let variants = variants.iter().filter(|v| !v.skipped).map(|variant| {
                let json = &variant.json_name;
                let (ty, nested) = match &variant.shape {
                    Shape::Unit => ("variant".to_owned(), quote!(&[])),
                    // serde writes a newtype variant's value as is: its fields are the variant's.
                    Shape::Tuple(fields) if fields.len() == 1 => {
                        (format!("variant({})", type_string(fields[0].ty)), nested_fields(&private, &fields[0]))
                    }
                    Shape::Tuple(fields) => {
                        let types: Vec<String> = variant.shape.fields().map(|f| type_string(f.ty)).collect();
                        let fields = field_schemas(&private, fields.iter().filter(|f| !f.skipped));
                        (format!("variant({})", types.join(",")), quote!(&[#(#fields),*]))
                    }
                    Shape::Named(_) => {
                        let fields = field_schemas(&private, variant.shape.fields());
                        ("variant{}".to_owned(), quote!(&[#(#fields),*]))
                    }
                };
                quote!(#private::FieldSchema { name: #json, ty: #ty, fields: #nested })
            });
            quote!(&[#(#variants),*])
        }
    };
    payload_impl(&private, payload.ident, payload.generics, fields)
}

/// What a failed `#[derive(PayloadSchema)]` still emits: an impl whose fields the lock comparison accepts
/// as they are, so that neither the types holding this one nor a locked entry add a second error.
pub fn payload_fallback(input: &syn::DeriveInput) -> TokenStream {
    let private = crate::paths::derive_private();
    payload_impl(&private, &input.ident, &input.generics, quote!(#private::UNCHECKED_FIELDS))
}

/// `where` with `extra`'s predicates and the serde bound of `DomainEvent`. Stated with a higher-ranked
/// bound, the impl itself is accepted when serde's traits are missing (it then never applies), so the
/// serde check is the only error.
fn serde_where(
    private: &TokenStream,
    ident: &syn::Ident,
    ty_generics: &syn::TypeGenerics<'_>,
    extra: Option<&syn::WhereClause>,
) -> syn::WhereClause {
    let mut where_clause = extra.cloned().unwrap_or_else(|| syn::parse_quote!(where));
    where_clause.predicates.push(syn::parse_quote!(
        for<'__outbox> #ident #ty_generics: #private::serde::Serialize + #private::serde::de::DeserializeOwned
    ));
    where_clause
}

/// What a failed `#[derive(DomainEvent)]` still emits (thiserror's fallback): `PayloadSchema` and
/// `DomainEvent` impls that are never run, so that every use of the type (`emit!`, `Consumer::on`, an
/// `E: DomainEvent` bound) compiles and the derive's error is the only one.
pub fn event_fallback(input: &syn::DeriveInput) -> TokenStream {
    let ident = &input.ident;
    let private = crate::paths::derive_private();
    let payload = payload_impl(&private, ident, &input.generics, quote!(#private::UNCHECKED_FIELDS));
    let generics = with_schema_bounds(&private, &input.generics);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let where_clause = serde_where(&private, ident, &ty_generics, where_clause);
    let type_name = ident.to_string();
    quote! {
        #payload

        #[automatically_derived]
        impl #impl_generics #private::DomainEvent for #ident #ty_generics #where_clause {
            const NAME: &'static str = "";
            const VERSION: i32 = 1;
            const OLDEST_VERSION: i32 = 1;
            const AGGREGATE_TYPE: &'static str = "";
            const SCHEMA: #private::EventSchema = #private::EventSchema {
                name: "",
                version: 1,
                type_name: #type_name,
                fields: #private::UNCHECKED_FIELDS,
                upcast_from: &[],
            };

            fn aggregate_id(&self) -> ::std::string::String {
                ::std::unreachable!("`#[derive(DomainEvent)]` failed to compile")
            }

            fn decode_version(
                _version: i32,
                _payload: &str,
            ) -> ::std::result::Result<Self, #private::serde_json::Error> {
                ::std::unreachable!("`#[derive(DomainEvent)]` failed to compile")
            }
        }
    }
}

/// The locked fields as `FieldSchema` tokens, for the generated comparison.
fn locked_tokens(private: &TokenStream, nodes: &[LockedNode]) -> TokenStream {
    let nodes = nodes.iter().map(|node| {
        let name = &node.name;
        let ty = crate::schema_lock::normalize_type(&node.ty);
        let fields = locked_tokens(private, &node.fields);
        quote!(#private::FieldSchema { name: #name, ty: #ty, fields: #fields })
    });
    quote!(&[#(#nodes),*])
}

/// `fields_match` is false when the derive already reported a changed field of the event itself: the
/// nested comparison would only repeat it.
pub fn expand(event: &Event<'_>, lock: &Lock, fields_match: bool) -> TokenStream {
    let ident = event.ident;
    let private = crate::paths::derive_private();
    let generics = with_schema_bounds(&private, event.generics);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    // Validated before expansion: all three are present.
    let name = event.name.as_ref().map(syn::LitStr::value).unwrap_or_default();
    let version: i32 = event.version.as_ref().and_then(|v| v.base10_parse().ok()).unwrap_or(1);
    let aggregate = event.aggregate.as_ref().map(syn::LitStr::value).unwrap_or_default();
    let oldest = event.upcasts.iter().map(|u| u.version as i32).min().unwrap_or(version);
    let type_name = ident.to_string();

    let fields = field_schemas(&private, event.fields.iter().filter(|f| !f.skipped));
    let payload = payload_impl(&private, ident, event.generics, quote!(&[#(#fields),*]));

    let id_field = event.fields.iter().find(|f| f.aggregate_id.is_some()).and_then(|f| f.ident);
    let aggregate_id = quote_spanned! {id_field.span()=>
        ::std::string::ToString::to_string(&self.#id_field)
    };

    // vN payload → TypeN → TypeN+1 → … → Self, each step a `From` conversion spanned at its type.
    let mut upcasts: Vec<_> = event.upcasts.iter().collect();
    upcasts.sort_by_key(|u| u.version);
    let arms = upcasts.iter().enumerate().map(|(i, upcast)| {
        let v = upcast.version as i32;
        let ty = &upcast.ty;
        let steps = upcasts[i + 1..].iter().map(|next| {
            let next_ty = &next.ty;
            quote_spanned!(next_ty.span()=> let value: #next_ty = ::std::convert::From::from(value);)
        });
        let last = quote_spanned!(ty.span()=> ::std::convert::From::from(value));
        quote! {
            #v => {
                let value: #ty = #private::serde_json::from_str(payload)?;
                #(#steps)*
                ::std::result::Result::Ok(#last)
            }
        }
    });
    // Each older version's schema is its `upcast_from` struct's, which must describe itself.
    let older = upcasts.iter().map(|upcast| {
        let v = upcast.version as i32;
        let ty = &upcast.ty;
        let ty_name = type_string(ty);
        let fields = quote_spanned!(ty.span()=> <#ty as #private::PayloadSchema>::FIELDS);
        quote! {
            #private::EventSchema { name: #name, version: #v, type_name: #ty_name, fields: #fields, upcast_from: &[] }
        }
    });

    // Rebuild when the lock file changes.
    let track = lock.exists.then(|| {
        let path = lock.path.display().to_string();
        quote!(
            const _: &[u8] = ::std::include_bytes!(#path);
        )
    });

    // A generic event has no one type to register or to check at compile time: the explicit list covers it.
    let concrete = event.generics.params.is_empty();
    let schema = quote! {
        #private::EventSchema {
            name: #name,
            version: #version,
            type_name: #type_name,
            fields: <#ident #ty_generics as #private::PayloadSchema>::FIELDS,
            upcast_from: &[#(#older),*],
        }
    };
    // Registered from its parts, not through `DomainEvent`, so a type missing serde's derives gets the
    // one serde error below and no second one here.
    let register = concrete.then(|| {
        let lock_file = lock.path.display().to_string();
        quote! {
            #private::inventory::submit! {
                #private::RegisteredEvent {
                    lock_file: #lock_file,
                    schema: #schema,
                }
            }
        }
    });
    // `Serialize` first, `Deserialize` only when it is there: one error for a missing `#[derive]`, not one
    // per missing trait.
    let serde_check = concrete.then(|| {
        quote_spanned! {ident.span()=>
            const _: fn() = || {
                #[allow(unused_imports)]
                use #private::{NoSerialize as _, SerdeOk as _, SerializeOnly as _};
                (&&&#private::serde_probe::<#ident>()).missing().check::<#ident>();
            };
        }
    });
    let where_clause = serde_where(&private, ident, &ty_generics, where_clause);
    let checks = if concrete { locked_checks(event, lock, &private, &name, version, fields_match) } else { Vec::new() };

    quote! {
        #track

        #serde_check

        #payload

        #[automatically_derived]
        impl #impl_generics #private::DomainEvent for #ident #ty_generics #where_clause {
            const NAME: &'static str = #name;
            const VERSION: i32 = #version;
            const OLDEST_VERSION: i32 = #oldest;
            const AGGREGATE_TYPE: &'static str = #aggregate;
            const SCHEMA: #private::EventSchema = #schema;

            fn aggregate_id(&self) -> ::std::string::String {
                #aggregate_id
            }

            fn decode_version(
                version: i32,
                payload: &str,
            ) -> ::std::result::Result<Self, #private::serde_json::Error> {
                match version {
                    #(#arms)*
                    _ => #private::serde_json::from_str(payload),
                }
            }
        }

        #register

        #(#checks)*
    }
}

/// The compile-time comparisons of what the derive cannot see with the locked entries: each field of the
/// event whose entry locks nested lines (spanned at the field), and each `upcast_from` struct whose
/// version is locked (spanned at the struct in the attribute).
fn locked_checks(
    event: &Event<'_>,
    lock: &Lock,
    private: &TokenStream,
    name: &str,
    version: i32,
    fields_match: bool,
) -> Vec<TokenStream> {
    let mut checks = Vec::new();
    if fields_match && let Some(entry) = lock.entry(name, version) {
        let ident = event.ident;
        let advice = super::lock::released_advice(version);
        for (index, field) in event.fields.iter().filter(|f| !f.skipped).enumerate() {
            if field.by_name {
                continue;
            }
            let Some(node) = entry.iter().find(|n| n.name == field.json_name) else { continue };
            if node.fields.is_empty() {
                continue;
            }
            let prefix = &field.json_name;
            let head = format!(
                "event `{name} v{version}` does not match its entry in events.lock (a type inside field `{prefix}` \
                 changed)"
            );
            let locked = locked_tokens(private, &node.fields);
            // The field's nested schema as the event's own `PayloadSchema` impl computed it: no second
            // `PayloadSchema` bound on the field's type, whose absence is already an error there.
            let now = quote!(<#ident as #private::PayloadSchema>::FIELDS[#index].fields);
            checks.push(lock_assertion(private, &head, &advice, prefix, locked, now, field.span()));
        }
    }
    for upcast in &event.upcasts {
        let v = upcast.version as i32;
        let Some(entry) = lock.entry(name, v) else { continue };
        let ty = &upcast.ty;
        let ty_name = type_string(ty);
        let head = format!(
            "`{ty_name}` decodes the stored `{name} v{v}` events and does not match their entry in events.lock"
        );
        let advice = format!(
            "Every stored v{v} event would fail to decode: restore the locked fields of `{ty_name}` (serde \
             renames and nested types included); it must keep the shape v{v} was released with"
        );
        let locked = locked_tokens(private, &entry);
        let now = quote_spanned!(ty.span()=> <#ty as #private::PayloadSchema>::FIELDS);
        checks.push(lock_assertion(private, &head, &advice, "", locked, now, ty.span()));
    }
    checks
}

/// `const _: () = if let Some(m) = lock_mismatch(..) { panic!("{}", m) };` at `span`: the panic is the
/// `const`'s own and its tokens are spanned as if the user had written them there, so rustc reports one
/// error at the field with the message, and no note pointing into the runtime or the derive.
fn lock_assertion(
    private: &TokenStream,
    head: &str,
    advice: &str,
    prefix: &str,
    locked: TokenStream,
    now: TokenStream,
    span: Span,
) -> TokenStream {
    let start = respan(
        quote!(const _: () = if let ::std::option::Option::Some(__outbox_mismatch) = #private::lock_mismatch),
        span,
    );
    // `now` keeps its own spans: a type error in it belongs where the type is written.
    let mut args = proc_macro2::Group::new(Delimiter::Parenthesis, quote!(#head, #advice, #prefix, #locked, #now));
    args.set_span(span);
    let panic = respan(quote!({ ::std::panic!("{}", __outbox_mismatch.as_str()) };), span);
    quote!(#start #args #panic)
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            }
            tree.set_span(span);
            tree
        })
        .collect()
}
