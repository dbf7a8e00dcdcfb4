//! `#[idempotent_handler(consumer = "...")]`: decode, inbox dedup and effect in one transaction.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Type};

use crate::diagnostics::{Errors, with_item};
use crate::signature::result_types;

struct Args {
    consumer: Option<LitStr>,
}

fn parse_args(args: TokenStream) -> syn::Result<Args> {
    let mut parsed = Args { consumer: None };
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
    syn::parse::Parser::parse2(parser, args)?;
    Ok(parsed)
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

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = match parse_args(args) {
        Ok(args) => args,
        Err(e) => return with_item(item, e),
    };
    let function = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), "`#[idempotent_handler]` goes on an `async fn`");
            return with_item(item, error);
        }
    };
    match generate(&args, &function) {
        Ok(tokens) => tokens,
        Err(e) => with_item(item, e),
    }
}

fn generate(args: &Args, function: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let sig = &function.sig;
    match &args.consumer {
        None => errors.push(syn::Error::new(
            Span::call_site(),
            "missing `consumer = \"name\"`: the inbox records messages per consumer",
        )),
        Some(c) if c.value().trim().is_empty() || c.value().len() > 128 => {
            errors.at(c, "`consumer` must be a non-empty name of at most 128 bytes")
        }
        Some(_) => {}
    }
    if sig.asyncness.is_none() {
        errors.at(sig.fn_token, format!("`{}` must be `async fn`", sig.ident));
    }
    if !sig.generics.params.is_empty() {
        errors.at(&sig.generics, "an idempotent handler cannot be generic: it decodes one concrete event type");
    }
    let inputs: Vec<_> = sig.inputs.iter().collect();
    let typed: Vec<_> = inputs
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
    errors.finish()?;
    let (Some(event), Some((ok_ty, err_ty)), Some(consumer)) = (event, results, &args.consumer) else {
        return Err(syn::Error::new_spanned(&sig.ident, "unreachable: checked above"));
    };

    let private = quote!(::outbox_seaorm::__private);
    let attrs = &function.attrs;
    let vis = &function.vis;
    let name = &sig.ident;
    let body_name = format_ident!("__{}_body", name);
    let inputs_list = &sig.inputs;
    let output = &sig.output;
    let block = &function.block;
    let event_ty = &event.ty;
    let call_args = if envelope.is_some() { quote!(txn, event, message) } else { quote!(txn, event) };
    let assert_event = quote_spanned!(event_ty.span()=> #private::assert_domain_event::<#event_ty>(););
    Ok(quote! {
        #(#attrs)*
        #vis async fn #name<__C>(
            db: &__C,
            message: &#private::OutboxEvent,
        ) -> ::std::result::Result<#private::InboxOutcome<#ok_ty>, #private::InboxError<#err_ty>>
        where
            __C: #private::ConnectionTrait
                + #private::TransactionTrait<Transaction = #private::DatabaseTransaction>,
        {
            #assert_event
            async fn #body_name(#inputs_list) #output #block
            let event = <#event_ty as #private::DomainEvent>::from_envelope(message)?;
            let message_id = message.id.to_string();
            #private::handle_once(db, #consumer, &message_id, async move |txn| #body_name(#call_args).await).await
        }
    })
}
