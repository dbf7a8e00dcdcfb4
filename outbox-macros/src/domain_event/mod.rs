//! `#[derive(DomainEvent)]`: parse → validate → check the lock file → expand.

mod ast;
mod expand;
mod lock;
mod valid;

use proc_macro2::TokenStream;

pub fn derive(input: TokenStream) -> TokenStream {
    let result = syn::parse2::<syn::DeriveInput>(input).and_then(|input| {
        let event = ast::Event::from_syn(&input)?;
        valid::check(&event)?;
        lock::check(&event)?;
        Ok(expand::expand(&event))
    });
    // A derive cannot re-emit the struct; emit the errors alone (no impl, so no follow-on errors at use
    // sites beyond "does not implement DomainEvent").
    result.unwrap_or_else(syn::Error::into_compile_error)
}
