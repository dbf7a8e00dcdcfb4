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
        let mut tokens = expand::expand(&event);
        // A schema that drifted from events.lock is still a well-formed event: keep the impl so the only
        // error is the one naming the changed field.
        if let Err(drift) = lock::check(&event) {
            tokens.extend(drift.into_compile_error());
        }
        Ok(tokens)
    });
    // On a malformed input there is no impl to emit; the errors alone point at what to fix.
    result.unwrap_or_else(syn::Error::into_compile_error)
}
