//! `#[idempotent_handler(consumer = "...")]`: decode, inbox dedup and effect in one transaction.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, ItemFn, LitStr, Type};

use crate::diagnostics::{Errors, with_item};
use crate::signature::result_types;

struct Args {
    consumer: Option<LitStr>,
    /// The arguments did not parse: that error stands for them, no second one about `consumer`.
    malformed: bool,
}

fn parse_args(args: TokenStream, errors: &mut Errors) -> Args {
    let mut parsed = Args { consumer: None, malformed: false };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("consumer") {
            parsed.consumer = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error(format!(
                "unknown key `{}`; expected `consumer = \"name\"`",
                meta.path.get_ident().map(ToString::to_string).unwrap_or_default()
            )))
        }
    });
    if let Err(e) = syn::parse::Parser::parse2(parser, args) {
        errors.push(e);
        parsed.malformed = true;
    }
    parsed
}

fn is_envelope_ref(ty: &Type) -> bool {
    let Type::Reference(r) = ty else { return false };
    let Type::Path(p) = &*r.elem else { return false };
    r.mutability.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "OutboxEvent")
}

fn is_transaction_ref(ty: &Type) -> bool {
    let Type::Reference(r) = ty else { return false };
    let Type::Path(p) = &*r.elem else { return false };
    p.path.segments.last().is_some_and(|s| s.ident == "DatabaseTransaction")
}

/// Whether an attribute of the user's function belongs on the public handler rather than on the function
/// that keeps the user's signature and body: its docs, whether it exists, what callers are told, and lint
/// levels (the body is nested inside the handler, so they reach it too, and an `#[expect]` is fulfilled
/// once).
fn is_handler_attr(attr: &Attribute) -> bool {
    ["doc", "cfg", "deprecated", "must_use", "allow", "warn", "deny", "forbid", "expect"]
        .iter()
        .any(|name| attr.path().is_ident(name))
}

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = parse_args(args, &mut errors);
    let Ok(function) = syn::parse2::<ItemFn>(item.clone()) else {
        errors.push(syn::Error::new(Span::call_site(), "`#[idempotent_handler]` goes on an `async fn`"));
        let Err(error) = errors.finish() else { return item };
        return with_item(item, error);
    };
    let handler = check(&args, &function, &mut errors);
    match (errors.finish(), handler) {
        (Ok(()), Some(handler)) => generate(&function, &handler),
        // The signature is right (only the arguments are not): the handler as it would be, so its callers
        // and its body are checked as usual.
        (Err(error), Some(handler)) if handler.callable => {
            let mut tokens = error.into_compile_error();
            tokens.extend(generate(&function, &handler));
            tokens
        }
        // The handler's signature is known: it stands in for the handler (its callers compile), with the
        // user's function inside it, unchanged and never called.
        (Err(error), Some(handler)) => {
            let mut tokens = error.into_compile_error();
            tokens.extend(fallback(&function, &handler));
            tokens
        }
        (Err(error), None) => with_item(item, error),
        (Ok(()), None) => with_item(item, syn::Error::new_spanned(&function.sig.ident, "unreachable: no handler")),
    }
}

/// What the generated handler needs of the user's signature.
struct Handler<'a> {
    consumer: Option<&'a LitStr>,
    event_ty: &'a Type,
    ok_ty: &'a Type,
    err_ty: &'a Type,
    envelope: bool,
    /// The user's function can be called as `name(txn, event[, envelope])` from the generated handler.
    callable: bool,
    /// The user's function is a method: it cannot be nested in the handler as it is.
    method: bool,
}

/// Checks the arguments and the signature; `None` when the handler's own signature cannot be written (no
/// event parameter, or no `Result`).
fn check<'a>(args: &'a Args, function: &'a ItemFn, errors: &mut Errors) -> Option<Handler<'a>> {
    let sig = &function.sig;
    match &args.consumer {
        None if args.malformed => {}
        None => errors.push(syn::Error::new(
            Span::call_site(),
            "missing `consumer = \"name\"`: the inbox records messages per consumer",
        )),
        Some(c) if c.value().trim().is_empty() || c.value().len() > 128 => {
            errors.at(c, "`consumer` must be a non-empty name of at most 128 bytes")
        }
        Some(_) => {}
    }
    let args_errors = errors.count();
    if sig.asyncness.is_none() {
        errors.at(sig.fn_token, format!("`{}` must be `async fn`", sig.ident));
    }
    if !sig.generics.params.is_empty() {
        errors.at(&sig.generics, "an idempotent handler cannot be generic: it decodes one concrete event type");
    }
    let typed: Vec<_> = sig
        .inputs
        .iter()
        .filter_map(|a| match a {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(r) => {
                errors.at(r, "an idempotent handler is a free function, not a method: take the state you need as a parameter of the body, or call a method from it");
                None
            }
        })
        .collect();
    let (txn, event, envelope) = match typed.as_slice() {
        [txn, event] => (Some(*txn), Some(*event), None),
        [txn, event, envelope] => (Some(*txn), Some(*event), Some(*envelope)),
        _ => {
            errors.at(
                &sig.inputs,
                "an idempotent handler takes two parameters, `txn: &DatabaseTransaction, event: YourEvent`, and optionally a third, `envelope: &OutboxEvent` (id, time, headers)",
            );
            (None, None, None)
        }
    };
    if let Some(envelope) = envelope
        && !is_envelope_ref(&envelope.ty)
    {
        errors.at(
            &envelope.ty,
            "the third parameter must be the envelope, `envelope: &OutboxEvent`: it gives the handler the event's id, time and headers",
        );
    }
    if let Some(txn) = txn
        && !is_transaction_ref(&txn.ty)
    {
        errors.at(
            &txn.ty,
            "the first parameter must be the transaction, `txn: &DatabaseTransaction`: the effect runs in the same transaction as the inbox row",
        );
    }
    let results = result_types(&sig.output);
    if results.is_none() {
        errors.at(
            &sig.ident,
            "an idempotent handler returns `Result<T, E>`: `Err` rolls back the effect and the inbox row so the message can be retried",
        );
    }
    let signature_errors = errors.count() - args_errors;
    let (event, (ok_ty, err_ty)) = (event?, results?);
    Some(Handler {
        consumer: args.consumer.as_ref(),
        event_ty: &event.ty,
        ok_ty,
        err_ty,
        envelope: envelope.is_some(),
        callable: signature_errors == 0,
        method: sig.receiver().is_some(),
    })
}

/// The handler's signature: `name<C>(db: &C, message: &OutboxEvent) -> Result<InboxOutcome<T>,
/// InboxError<E>>`, with the user's docs, `cfg`s and lint levels.
fn handler_signature(function: &ItemFn, handler: &Handler<'_>, private: &TokenStream) -> TokenStream {
    let attrs = function.attrs.iter().filter(|a| is_handler_attr(a));
    let vis = &function.vis;
    let name = &function.sig.ident;
    let (ok_ty, err_ty) = (handler.ok_ty, handler.err_ty);
    quote! {
        #(#attrs)*
        #vis async fn #name<__C>(
            db: &__C,
            message: &#private::OutboxEvent,
        ) -> ::std::result::Result<#private::InboxOutcome<#ok_ty>, #private::InboxError<#err_ty>>
        where
            __C: #private::OutboxConnection + ?::core::marker::Sized,
    }
}

/// The user's function as written, nested in the handler under its own name, with every attribute that is
/// not the handler's (`#[tracing::instrument]`, `#[cfg_attr]`, `#[inline]`, ...): they see the user's
/// parameters and body.
fn user_function(function: &ItemFn) -> TokenStream {
    let attrs = function.attrs.iter().filter(|a| !is_handler_attr(a));
    let sig = &function.sig;
    let block = &function.block;
    quote!(#(#attrs)* #sig #block)
}

fn generate(function: &ItemFn, handler: &Handler<'_>) -> TokenStream {
    let (seaorm, _) = crate::paths::seaorm();
    let private = quote!(#seaorm::__private);
    let signature = handler_signature(function, handler, &private);
    let user_function = user_function(function);
    let name = &function.sig.ident;
    let event_ty = handler.event_ty;
    // Only reached with an error already reported when the consumer is missing.
    let consumer = handler.consumer.map_or_else(|| quote!(""), |c| quote!(#c));
    let call_args = if handler.envelope { quote!(txn, event, message) } else { quote!(txn, event) };
    let assert_event = quote_spanned!(event_ty.span()=> #private::assert_domain_event::<#event_ty>(););
    quote! {
        #signature
        {
            #assert_event
            #user_function
            let event = <#event_ty as #private::DomainEvent>::from_envelope(message)?;
            let message_id = message.id.to_string();
            #private::handle_once(db, #consumer, &message_id, async move |txn| #name(#call_args).await).await
        }
    }
}

/// The handler of a function whose signature is wrong: the same signature as [`generate`]'s (so callers
/// compile) around the user's function, kept for its own checks and never called.
fn fallback(function: &ItemFn, handler: &Handler<'_>) -> TokenStream {
    let (seaorm, _) = crate::paths::seaorm();
    let private = quote!(#seaorm::__private);
    let signature = handler_signature(function, handler, &private);
    let user_function = (!handler.method).then(|| {
        let user_function = user_function(function);
        quote!(#[allow(dead_code)] #user_function)
    });
    quote! {
        #signature
        {
            #user_function
            let _ = (db, message);
            ::std::unreachable!("`#[idempotent_handler]` failed to compile")
        }
    }
}
