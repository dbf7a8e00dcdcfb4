//! `#[idempotent_handler]`: the function as written becomes the handler a consumer registers with
//! `.on(name)` (or `.on_batch(name)`): inbox dedup and effect in one transaction, the consumer's name and
//! the decoded event taken from the message the consumer hands over.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, GenericArgument, ItemFn, PathArguments, Type};

use crate::diagnostics::{Errors, with_item};
use crate::signature::result_types;

/// What the attribute's arguments came to: nothing is expected, so anything given is an error.
struct Args {
    /// The arguments did not parse: that error stands for them.
    malformed: bool,
}

fn parse_args(args: TokenStream, errors: &mut Errors) -> Args {
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("consumer") {
            Err(meta.error(
                "the consumer is named once, by `Consumer::new(\"name\")`, which hands its name to the handler with each message: remove `consumer = …` and register the handler with `.on(handler)`",
            ))
        } else {
            Err(meta.error(format!(
                "unknown key `{}`: `#[idempotent_handler]` takes no arguments",
                meta.path.get_ident().map(ToString::to_string).unwrap_or_default()
            )))
        }
    });
    let malformed = match syn::parse::Parser::parse2(parser, args) {
        Ok(()) => false,
        Err(e) => {
            errors.push(e);
            true
        }
    };
    Args { malformed }
}

/// `T` of a type spelled `Vec<T>` (any path ending in `Vec` with one type argument).
fn vec_item(ty: &Type) -> Option<&Type> {
    single_argument(ty, "Vec")
}

/// `E` of a type spelled `Received<E>`.
fn received_event(ty: &Type) -> Option<&Type> {
    single_argument(ty, "Received")
}

/// `T` of a type spelled `…::Name<T>`.
fn single_argument<'t>(ty: &'t Type, name: &str) -> Option<&'t Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    match args.args.first()? {
        GenericArgument::Type(item) if args.args.len() == 1 => Some(item),
        _ => None,
    }
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
    /// The event type: the second parameter's, or its item's for a batch.
    event_ty: &'a Type,
    ok_ty: &'a Type,
    err_ty: &'a Type,
    envelope: bool,
    /// How the events arrive: one at a time, or several (`Vec<E>` / `Vec<Received<E>>`).
    batch: Option<Batch>,
    /// The user's function can be called as `name(txn, event[, envelope])` from the generated handler.
    callable: bool,
    /// The user's function is a method: it cannot be nested in the handler as it is.
    method: bool,
}

/// A batch handler's second parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// `events: Vec<E>`.
    Events,
    /// `received: Vec<Received<E>>`: with each event's envelope and delivery count.
    Received,
}

/// Checks the arguments and the signature; `None` when the handler's own signature cannot be written (no
/// event parameter, or no `Result`).
fn check<'a>(args: &Args, function: &'a ItemFn, errors: &mut Errors) -> Option<Handler<'a>> {
    let sig = &function.sig;
    let args_errors = usize::from(args.malformed);
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
                "an idempotent handler takes two parameters, `txn: &DatabaseTransaction, event: YourEvent` (or `events: Vec<YourEvent>` for several at once), and optionally a third, `envelope: &OutboxEvent` (id, time, headers)",
            );
            (None, None, None)
        }
    };
    let batch = event.and_then(|event| {
        let item = vec_item(&event.ty)?;
        Some(match received_event(item) {
            Some(event) => (event, Batch::Received),
            None => (item, Batch::Events),
        })
    });
    if let Some(envelope) = envelope {
        if batch.is_some() {
            errors.at(
                envelope,
                "a batch handler has no third parameter: take `Vec<Received<YourEvent>>` to read each event's envelope",
            );
        } else if !is_envelope_ref(&envelope.ty) {
            errors.at(
                &envelope.ty,
                "the third parameter must be the envelope, `envelope: &OutboxEvent`: it gives the handler the event's id, time and headers",
            );
        }
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
        event_ty: batch.map_or(&event.ty, |(event, _)| event),
        ok_ty,
        err_ty,
        envelope: envelope.is_some() && batch.is_none(),
        batch: batch.map(|(_, batch)| batch),
        callable: signature_errors == 0,
        method: sig.receiver().is_some(),
    })
}

/// The handler's signature, what `Consumer::on` (or `on_batch`) takes: `name(received: Received<E>) ->
/// Result<InboxOutcome<T>, InboxError<Err>>`, or `name(batch: Vec<Received<E>>) ->
/// Result<Vec<InboxOutcome<()>>, InboxError<Err>>`, with the user's docs, `cfg`s and lint levels.
fn handler_signature(function: &ItemFn, handler: &Handler<'_>, private: &TokenStream) -> TokenStream {
    let attrs = function.attrs.iter().filter(|a| is_handler_attr(a));
    let vis = &function.vis;
    let name = &function.sig.ident;
    let (event_ty, ok_ty, err_ty) = (handler.event_ty, handler.ok_ty, handler.err_ty);
    let (input, output) = match handler.batch {
        None => (quote!(received: #private::Received<#event_ty>), quote!(#private::InboxOutcome<#ok_ty>)),
        Some(_) => (
            quote!(received: ::std::vec::Vec<#private::Received<#event_ty>>),
            quote!(::std::vec::Vec<#private::InboxOutcome<()>>),
        ),
    };
    quote! {
        #(#attrs)*
        #vis async fn #name(#input) -> ::std::result::Result<#output, #private::InboxError<#err_ty>>
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
    let assert_event = quote_spanned!(event_ty.span()=> #private::assert_domain_event::<#event_ty>(););
    let body = match handler.batch {
        None => {
            let call_args = if handler.envelope { quote!(txn, event, message) } else { quote!(txn, event) };
            quote! {
                let #private::Received { event, envelope, consumer, .. } = received;
                let message = &envelope;
                #private::handle_received(&consumer, message, async move |txn| #name(#call_args).await).await
            }
        }
        Some(batch) => {
            let events = match batch {
                Batch::Received => quote!(fresh),
                Batch::Events => quote!(fresh.into_iter().map(|received| received.event).collect()),
            };
            quote! {
                #private::handle_received_batch(received, async move |txn, fresh| {
                    #name(txn, #events).await.map(|_| ())
                })
                .await
            }
        }
    };
    quote! {
        #signature
        {
            #assert_event
            #user_function
            #body
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
            let _ = received;
            ::std::unreachable!("`#[idempotent_handler]` failed to compile")
        }
    }
}
