//! Reading function signatures.

use syn::{GenericArgument, PathArguments, ReturnType, Type};

/// `(T, E)` of a return type spelled `Result<T, E>` (any path ending in `Result` with two type arguments).
pub fn result_types(ret: &ReturnType) -> Option<(&Type, &Type)> {
    let ReturnType::Type(_, ty) = ret else { return None };
    let Type::Path(path) = &**ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    let mut types = args.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    Some((types.next()?, types.next()?))
}
