//! Finding the SeaORM connection of a `#[transactional_outbox]` method.

use proc_macro2::TokenStream;
use syn::{FnArg, GenericParam, Ident, Pat, Signature, Type, TypeParamBound};

/// The parameter holding the connection.
pub struct ConnectionParam {
    /// The parameter's identifier.
    pub ident: Ident,
    /// Its position in the signature's inputs.
    index: usize,
    /// How its type is written.
    kind: Kind,
}

/// How a connection parameter's type is written.
#[derive(Clone, PartialEq, Eq)]
enum Kind {
    /// `&DatabaseConnection`: widened to `&impl OutboxConnection`, so the method also joins a caller's
    /// transaction.
    Pool,
    /// `&DatabaseTransaction`.
    Transaction,
    /// `&C` for a type parameter `C` bounded by `TransactionTrait` (or `OutboxConnection`).
    Generic(Ident),
    /// `&impl TransactionTrait` (or `&impl OutboxConnection`).
    ImplTrait,
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

/// How `ty` is a connection of `sig`, if it is one.
fn kind(ty: &Type, sig: &Signature) -> Option<Kind> {
    let Type::Reference(reference) = ty else { return None };
    if let Type::ImplTrait(imp) = &*reference.elem {
        return bounds_mention_transaction(imp.bounds.iter()).then_some(Kind::ImplTrait);
    }
    let name = last_segment(&reference.elem)?;
    if name == "DatabaseConnection" {
        return Some(Kind::Pool);
    }
    if name == "DatabaseTransaction" {
        return Some(Kind::Transaction);
    }
    let generic = sig.generics.params.iter().find_map(|p| match p {
        GenericParam::Type(t) if t.ident == name => Some(t),
        _ => None,
    })?;
    let in_where = sig.generics.where_clause.iter().flat_map(|w| &w.predicates).any(|p| match p {
        syn::WherePredicate::Type(pt) => {
            last_segment(&pt.bounded_ty).is_some_and(|n| n == name) && bounds_mention_transaction(pt.bounds.iter())
        }
        _ => false,
    });
    (bounds_mention_transaction(generic.bounds.iter()) || in_where).then(|| Kind::Generic(generic.ident.clone()))
}

/// The first parameter of `sig` that is a SeaORM connection, if any.
pub fn find(sig: &Signature) -> Option<ConnectionParam> {
    sig.inputs.iter().enumerate().find_map(|(index, arg)| match arg {
        FnArg::Typed(pt) => {
            let kind = kind(&pt.ty, sig)?;
            match &*pt.pat {
                Pat::Ident(pi) => Some(ConnectionParam { ident: pi.ident.clone(), index, kind }),
                _ => None,
            }
        }
        FnArg::Receiver(_) => None,
    })
}

/// A parameter that holds a connection in a smart pointer (`db: Arc<DatabaseConnection>`, `&Arc<…>`,
/// `Box<…>`, `Rc<…>`), which the macro cannot take as the method's connection: its identifier and the
/// pointer's name.
pub fn find_wrapped(sig: &Signature) -> Option<(&Ident, String)> {
    fn wrapper(ty: &Type) -> Option<String> {
        match ty {
            Type::Reference(r) => wrapper(&r.elem),
            Type::Path(p) => {
                let last = p.path.segments.last()?;
                let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return None };
                let inner = args.args.iter().find_map(|a| match a {
                    syn::GenericArgument::Type(t) => Some(t),
                    _ => None,
                })?;
                let is_connection =
                    last_segment(inner).is_some_and(|n| n == "DatabaseConnection" || n == "DatabaseTransaction");
                is_connection.then(|| last.ident.to_string())
            }
            _ => None,
        }
    }
    sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(pt) => match &*pt.pat {
            Pat::Ident(pi) => wrapper(&pt.ty).map(|w| (&pi.ident, w)),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    })
}

/// Makes the parameter an `OutboxConnection`: widens `&DatabaseConnection` to `&impl OutboxConnection`
/// (so the method also takes a caller's `&DatabaseTransaction` and joins it with a savepoint), and adds
/// the bound to a generic or `impl Trait` parameter. Returns the type it replaced (`DatabaseConnection`
/// as written), if any, so the body can keep naming it.
pub fn generalise(sig: &mut Signature, param: &ConnectionParam, seaorm: &TokenStream) -> Option<Type> {
    match &param.kind {
        Kind::Transaction => None,
        Kind::Generic(ident) => {
            let span = ident.span();
            let predicate: syn::WherePredicate = syn::parse_quote_spanned!(span=> #ident: #seaorm::OutboxConnection);
            sig.generics.make_where_clause().predicates.push(predicate);
            None
        }
        Kind::Pool | Kind::ImplTrait => {
            let Some(FnArg::Typed(pt)) = sig.inputs.iter_mut().nth(param.index) else { return None };
            let Type::Reference(reference) = &mut *pt.ty else { return None };
            if let Type::ImplTrait(imp) = &mut *reference.elem {
                let span = syn::spanned::Spanned::span(&imp.bounds);
                imp.bounds.push(syn::parse_quote_spanned!(span=> #seaorm::OutboxConnection));
                return None;
            }
            let span = syn::spanned::Spanned::span(&reference.elem);
            let widened: Type = syn::parse_quote_spanned!(span=> impl #seaorm::OutboxConnection);
            Some(std::mem::replace(&mut *reference.elem, widened))
        }
    }
}
