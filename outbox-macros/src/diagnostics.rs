//! Collects every error of one macro invocation, so a user sees them all in one compile.

use proc_macro2::TokenStream;
use quote::ToTokens;

/// Errors gathered while parsing and validating.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    /// Records an error at `tokens`' span.
    pub fn at(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error.
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// How many errors were recorded.
    pub fn count(&self) -> usize {
        self.0.as_ref().map_or(0, |all| all.into_iter().count())
    }

    /// `Err` with every error, if any.
    pub fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// The user's item unchanged plus the errors: keeps IDEs and rustc's own checks working.
pub fn with_item(item: TokenStream, error: syn::Error) -> TokenStream {
    let mut out = error.into_compile_error();
    out.extend(item);
    out
}
