//! Where generated code finds its support items.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Ident;

/// The support module of `#[derive(DomainEvent)]`: `outbox_seaorm::__private` in an app that depends on
/// outbox-seaorm, `outbox_runtime::__private` in a crate that depends only on the runtime (a consumer-only
/// crate declaring events without any database driver); renamed dependencies are followed.
pub fn derive_private() -> TokenStream {
    for package in ["outbox-seaorm", "outbox-runtime"] {
        match crate_name(package) {
            Ok(FoundCrate::Name(name)) => {
                let ident = Ident::new(&name, Span::call_site());
                return quote!(::#ident::__private);
            }
            // The crate itself (or its tests and doctests): it names itself with `extern crate self as`.
            Ok(FoundCrate::Itself) => {
                let ident = Ident::new(&package.replace('-', "_"), Span::call_site());
                return quote!(::#ident::__private);
            }
            Err(_) => {}
        }
    }
    quote!(::outbox_seaorm::__private)
}
