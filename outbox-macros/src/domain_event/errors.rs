//! Every error of one derive invocation, so a user sees them all in one compile (serde's `Ctxt`); the
//! derives' own copy, independent of the attribute macros' diagnostics.

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

    /// `Err` with every error, if any.
    pub fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}
