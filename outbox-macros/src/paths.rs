//! Where generated code finds its support items.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Ident;

/// The support module of `#[derive(DomainEvent)]` and `#[derive(PayloadSchema)]`, the runtime's
/// `__private` under the name `__derive`: `outbox_seaorm::__derive` (re-exported by outbox-seaorm) in an
/// app that depends on outbox-seaorm, `outbox_runtime::__derive` in a
/// crate that depends only on the runtime (a consumer-only crate declaring events without any database
/// driver); renamed dependencies are followed.
pub fn derive_private() -> TokenStream {
    for package in ["outbox-seaorm", "outbox-runtime"] {
        match crate_name(package) {
            Ok(FoundCrate::Name(name)) => {
                let ident = Ident::new(&name, Span::call_site());
                return quote!(::#ident::__derive);
            }
            // The crate itself (or its tests and doctests): it names itself with `extern crate self as`.
            Ok(FoundCrate::Itself) => {
                let ident = Ident::new(&package.replace('-', "_"), Span::call_site());
                return quote!(::#ident::__derive);
            }
            Err(_) => {}
        }
    }
    quote!(::outbox_seaorm::__derive)
}

/// How generated code names outbox-seaorm (`::outbox_seaorm`, or the app's rename of it), and every name
/// `emit!` may be qualified with (`outbox_seaorm::emit!`).
pub fn seaorm() -> (TokenStream, Vec<String>) {
    let mut names = vec!["outbox_seaorm".to_owned()];
    let path = match crate_name("outbox-seaorm") {
        Ok(FoundCrate::Name(name)) => {
            let ident = Ident::new(&name, Span::call_site());
            names.push(name);
            quote!(::#ident)
        }
        _ => quote!(::outbox_seaorm),
    };
    (path, names)
}
