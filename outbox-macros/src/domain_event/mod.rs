//! `#[derive(DomainEvent)]`: parse → validate → check the lock file → expand; and `#[derive(PayloadSchema)]`
//! for the types inside a payload and the `upcast_from` structs (parse → expand).

mod ast;
mod expand;
mod lock;
mod valid;

use proc_macro2::TokenStream;

pub fn derive(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<syn::DeriveInput>(input) {
        Ok(input) => input,
        Err(e) => return e.into_compile_error(),
    };
    match derive_event(&input) {
        Ok(tokens) => tokens,
        // thiserror's fallback: the errors, plus impls that keep every use of the type compiling, so one
        // mistake in the attribute is one error.
        Err(e) => {
            let mut tokens = e.into_compile_error();
            tokens.extend(expand::event_fallback(&input));
            tokens
        }
    }
}

fn derive_event(input: &syn::DeriveInput) -> syn::Result<TokenStream> {
    let event = ast::Event::from_syn(input)?;
    valid::check(&event)?;
    let lock = lock::Lock::load(&event)?;
    let drift = lock.check_fields(&event).err();
    let mut tokens = expand::expand(&event, &lock, drift.is_none());
    // A schema that drifted from events.lock is still a well-formed event: keep the impl so the only
    // error is the one naming the changed field.
    if let Some(drift) = drift {
        tokens.extend(drift.into_compile_error());
    }
    Ok(tokens)
}

pub fn derive_payload_schema(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<syn::DeriveInput>(input) {
        Ok(input) => input,
        Err(e) => return e.into_compile_error(),
    };
    match ast::Payload::from_syn(&input) {
        Ok(payload) => expand::expand_payload(&payload),
        // An impl without fields keeps the types that hold this one compiling: one mistake, one error.
        Err(e) => {
            let mut tokens = e.into_compile_error();
            tokens.extend(expand::payload_fallback(&input));
            tokens
        }
    }
}
