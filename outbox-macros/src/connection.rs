//! Finding the SeaORM connection of a `#[transactional_outbox]` method.

use syn::{FnArg, GenericParam, Ident, Pat, Signature, Type, TypeParamBound};

/// The parameter holding the connection.
pub struct ConnectionParam {
    /// The parameter's identifier.
    pub ident: Ident,
    /// Its position in the signature's inputs.
    index: usize,
    /// Whether its type is `&DatabaseConnection`, which [`generalise`] widens so that the method also
    /// joins a caller's transaction.
    is_pool: bool,
}

fn last_segment(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        Type::Group(g) => last_segment(&g.elem),
        Type::Paren(p) => last_segment(&p.elem),
        _ => None,
    }
}

fn bounds_mention_transaction<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>) -> bool {
    bounds.any(|b| match b {
        TypeParamBound::Trait(t) => {
            t.path.segments.last().is_some_and(|s| s.ident == "TransactionTrait" || s.ident == "OutboxConnection")
        }
        _ => false,
    })
}

/// Whether `ty` is `&DatabaseConnection`, `&DatabaseTransaction`, `&impl TransactionTrait` or `&C` for a
/// generic `C: TransactionTrait` of `sig`; `Some(true)` for `&DatabaseConnection`.
fn is_connection(ty: &Type, sig: &Signature) -> Option<bool> {
    let Type::Reference(reference) = ty else { return None };
    if let Type::ImplTrait(imp) = &*reference.elem {
        return bounds_mention_transaction(imp.bounds.iter()).then_some(false);
    }
    let name = last_segment(&reference.elem)?;
    if name == "DatabaseConnection" {
        return Some(true);
    }
    if name == "DatabaseTransaction" {
        return Some(false);
    }
    let generic = sig.generics.params.iter().any(|p| match p {
        GenericParam::Type(t) => t.ident == name && bounds_mention_transaction(t.bounds.iter()),
        _ => false,
    });
    let in_where = sig.generics.where_clause.iter().flat_map(|w| &w.predicates).any(|p| match p {
        syn::WherePredicate::Type(pt) => {
            last_segment(&pt.bounded_ty).is_some_and(|n| n == name) && bounds_mention_transaction(pt.bounds.iter())
        }
        _ => false,
    });
    (generic || in_where).then_some(false)
}

/// The first parameter of `sig` that is a SeaORM connection, if any.
pub fn find(sig: &Signature) -> Option<ConnectionParam> {
    sig.inputs.iter().enumerate().find_map(|(index, arg)| match arg {
        FnArg::Typed(pt) => {
            let is_pool = is_connection(&pt.ty, sig)?;
            match &*pt.pat {
                Pat::Ident(pi) => Some(ConnectionParam { ident: pi.ident.clone(), index, is_pool }),
                _ => None,
            }
        }
        FnArg::Receiver(_) => None,
    })
}

/// Widens a `&DatabaseConnection` parameter to `&impl OutboxConnection`, so the method also takes a
/// caller's `&DatabaseTransaction` (and joins it with a savepoint): annotated methods compose.
/// Returns the type it replaced (`DatabaseConnection` as written), if any.
pub fn generalise(sig: &mut Signature, param: &ConnectionParam, seaorm: &proc_macro2::TokenStream) -> Option<Type> {
    if !param.is_pool {
        return None;
    }
    let Some(FnArg::Typed(pt)) = sig.inputs.iter_mut().nth(param.index) else { return None };
    let Type::Reference(reference) = &mut *pt.ty else { return None };
    let span = syn::spanned::Spanned::span(&reference.elem);
    let widened: Type = syn::parse_quote_spanned!(span=> impl #seaorm::OutboxConnection);
    Some(std::mem::replace(&mut *reference.elem, widened))
}
