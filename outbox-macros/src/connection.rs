//! Finding the SeaORM connection parameter of a function.

use syn::{FnArg, GenericParam, Ident, Pat, Signature, Type, TypeParamBound};

/// The parameter holding the connection: its name.
pub struct ConnectionParam {
    /// The parameter's identifier.
    pub ident: Ident,
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
        TypeParamBound::Trait(t) => t.path.segments.last().is_some_and(|s| s.ident == "TransactionTrait"),
        _ => false,
    })
}

/// Whether `ty` is `&DatabaseConnection`, `&DatabaseTransaction`, `&impl TransactionTrait` or `&C` for a
/// generic `C: TransactionTrait` of `sig`.
fn is_connection(ty: &Type, sig: &Signature) -> bool {
    let Type::Reference(reference) = ty else { return false };
    if let Type::ImplTrait(imp) = &*reference.elem {
        return bounds_mention_transaction(imp.bounds.iter());
    }
    let Some(name) = last_segment(&reference.elem) else { return false };
    if name == "DatabaseConnection" || name == "DatabaseTransaction" {
        return true;
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
    generic || in_where
}

/// The first parameter of `sig` that is a SeaORM connection, if any.
pub fn find(sig: &Signature) -> Option<ConnectionParam> {
    sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(pt) if is_connection(&pt.ty, sig) => match &*pt.pat {
            Pat::Ident(pi) => Some(ConnectionParam { ident: pi.ident.clone() }),
            _ => None,
        },
        _ => None,
    })
}
