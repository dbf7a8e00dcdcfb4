//! Code generation for `#[derive(DomainEvent)]`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use super::ast::Event;
use super::lock::{find_lock_file, type_string};

pub fn expand(event: &Event<'_>) -> TokenStream {
    let ident = event.ident;
    let (impl_generics, ty_generics, where_clause) = event.generics.split_for_impl();
    let private = crate::paths::derive_private();
    // Validated before expansion: all three are present.
    let name = event.name.as_ref().map(syn::LitStr::value).unwrap_or_default();
    let version: i32 = event.version.as_ref().and_then(|v| v.base10_parse().ok()).unwrap_or(1);
    let aggregate = event.aggregate.as_ref().map(syn::LitStr::value).unwrap_or_default();
    let oldest = event.upcasts.iter().map(|u| u.version as i32).min().unwrap_or(version);

    let fields = event.fields.iter().filter(|f| !f.skipped).map(|f| {
        let json = &f.json_name;
        let ty = type_string(f.ty);
        quote!(#private::FieldSchema { name: #json, ty: #ty })
    });

    let id_field = event.fields.iter().find(|f| f.aggregate_id.is_some()).map(|f| f.ident);
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

    // Rebuild when the lock file changes.
    let track = find_lock_file().map(|path| {
        let path = path.display().to_string();
        quote!(
            const _: &[u8] = ::std::include_bytes!(#path);
        )
    });

    quote! {
        #track

        impl #impl_generics #private::DomainEvent for #ident #ty_generics #where_clause {
            const NAME: &'static str = #name;
            const VERSION: i32 = #version;
            const OLDEST_VERSION: i32 = #oldest;
            const AGGREGATE_TYPE: &'static str = #aggregate;
            const SCHEMA: #private::EventSchema = #private::EventSchema {
                name: #name,
                version: #version,
                fields: &[#(#fields),*],
            };

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
    }
}
