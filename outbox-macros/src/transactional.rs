//! `#[transactional_outbox]`: run a service method in a transaction and write its `emit!`s there.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Block, Ident, ImplItem, Item, ReturnType, Signature, Type};

use crate::connection;
use crate::diagnostics::{Errors, with_item};
use crate::signature::result_types;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    if !args.is_empty() {
        let error = syn::Error::new_spanned(args, "`#[transactional_outbox]` takes no arguments");
        return with_item(item, error);
    }
    let parsed = match syn::parse2::<Item>(item.clone()) {
        Ok(parsed) => parsed,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[transactional_outbox]` goes on an inherent `impl` block or on an `async fn`",
            );
            return with_item(item, error);
        }
    };
    match parsed {
        Item::Impl(mut block) => {
            if let Some((_, path, _)) = &block.trait_ {
                let error = syn::Error::new_spanned(
                    path,
                    "`#[transactional_outbox]` goes on an inherent impl block (`impl Service { … }`), not a trait impl; put it on the methods of the inherent impl instead",
                );
                return with_item(item, error);
            }
            let mut errors = Errors::default();
            for member in &mut block.items {
                if let ImplItem::Fn(method) = member {
                    let has_conn = connection::find(&method.sig).is_some();
                    if !has_conn {
                        if uses_emit(&method.block) {
                            errors.at(&method.sig.ident, missing_connection_message(&method.sig.ident));
                        }
                        continue;
                    }
                    match rewrite(&method.sig, &method.block) {
                        Ok(block) => method.block = block,
                        Err(e) => errors.push(e),
                    }
                }
            }
            match errors.finish() {
                Ok(()) => quote!(#block),
                Err(e) => with_item(item, e),
            }
        }
        Item::Fn(mut function) => match rewrite(&function.sig, &function.block) {
            Ok(block) => {
                *function.block = block;
                quote!(#function)
            }
            Err(e) => with_item(item, e),
        },
        other => with_item(
            item,
            syn::Error::new_spanned(
                other,
                "`#[transactional_outbox]` goes on an inherent `impl` block or on an `async fn`",
            ),
        ),
    }
}

fn missing_connection_message(ident: &Ident) -> String {
    format!(
        "`{ident}` emits events but takes no SeaORM connection: add a parameter such as `db: &DatabaseConnection` (or `&DatabaseTransaction`, or `&C` with `C: TransactionTrait`) so the events join its transaction"
    )
}

/// The error type `E` of a `Result<T, E>` return type, if it is spelled that way.
fn error_type(ret: &ReturnType) -> Option<&Type> {
    result_types(ret).map(|(_, err)| err)
}

fn rewrite(sig: &Signature, block: &Block) -> syn::Result<Block> {
    let mut errors = Errors::default();
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token,
            format!("`{}` must be `async fn`: the transaction is awaited around its body", sig.ident),
        );
    }
    let conn = connection::find(sig);
    if conn.is_none() {
        errors.at(&sig.ident, missing_connection_message(&sig.ident));
    }
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) => Some(ty),
        ReturnType::Default => {
            errors.at(
                &sig.ident,
                format!(
                    "`{}` must return `Result<T, E>` with `E: From<sea_orm::DbErr>`: `Ok` commits the transaction and its events, `Err` rolls both back",
                    sig.ident
                ),
            );
            None
        }
    };
    errors.finish()?;
    let (Some(conn), Some(ret_ty)) = (conn, ret_ty) else {
        return Err(syn::Error::new_spanned(&sig.ident, "unreachable: checked above"));
    };

    let mut body = block.clone();
    let mut emits = EmitRewriter { replaced: 0 };
    emits.visit_block_mut(&mut body);
    let stmts = &body.stmts;
    let conn = &conn.ident;
    // Both places that need `E: From<DbErr>` are spanned at the user's error type (or the whole return
    // type when it is an alias such as `Result<T>`), so a missing conversion is reported once, there.
    let err_span = error_type(&sig.output).map_or_else(|| ret_ty.span(), Spanned::span);
    let begin = quote_spanned! {err_span=>
        match ::outbox_seaorm::__private::begin(#conn).await {
            ::std::result::Result::Ok(txn) => txn,
            ::std::result::Result::Err(error) => {
                return ::std::result::Result::Err(::outbox_seaorm::__private::AbsorbsDbErr::absorb(error));
            }
        }
    };
    let finish = quote_spanned! {err_span=>
        ::outbox_seaorm::__private::finish(__outbox_txn, __outbox_emitted, __outbox_result).await
    };
    let tokens = quote! {
        {
            let __outbox_txn = #begin;
            let __outbox_emitted = ::outbox_seaorm::__private::Emitted::default();
            let __outbox_result: #ret_ty = async {
                #[allow(unused_variables)]
                let #conn = &__outbox_txn;
                #(#stmts)*
            }
            .await;
            #finish
        }
    };
    syn::parse2(tokens)
}

fn is_emit(mac: &syn::Macro) -> bool {
    mac.path.segments.last().is_some_and(|s| s.ident == "emit")
}

fn uses_emit(block: &Block) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            self.0 |= is_emit(mac);
        }
    }
    let mut finder = Finder(false);
    syn::visit::Visit::visit_block(&mut finder, block);
    finder.0
}

/// Replaces `emit!(event)` with a push onto the method's list of emitted events, which are written into
/// the transaction with one multi-row insert just before it commits.
struct EmitRewriter {
    replaced: usize,
}

impl EmitRewriter {
    fn replacement(&mut self, mac: &syn::Macro) -> syn::Expr {
        self.replaced += 1;
        let tokens = match mac.parse_body::<syn::Expr>() {
            Ok(event) => quote_spanned! {event.span()=>
                ::outbox_seaorm::__private::emit(
                    &__outbox_emitted,
                    ::outbox_seaorm::__private::event_ref(&(#event)),
                )?
            },
            Err(_) => quote_spanned! {mac.span()=>
                ::std::compile_error!("`emit!` takes one event value: `emit!(OrderPlaced { … })`")
            },
        };
        syn::parse2(tokens).unwrap_or_else(|e| syn::Expr::Verbatim(e.into_compile_error()))
    }
}

impl VisitMut for EmitRewriter {
    fn visit_expr_mut(&mut self, expr: &mut syn::Expr) {
        if let syn::Expr::Macro(m) = expr
            && is_emit(&m.mac)
        {
            *expr = self.replacement(&m.mac);
            return;
        }
        syn::visit_mut::visit_expr_mut(self, expr);
    }

    fn visit_stmt_mut(&mut self, stmt: &mut syn::Stmt) {
        if let syn::Stmt::Macro(m) = stmt
            && is_emit(&m.mac)
        {
            let expr = self.replacement(&m.mac);
            *stmt = syn::Stmt::Expr(expr, Some(m.semi_token.unwrap_or_default()));
            return;
        }
        syn::visit_mut::visit_stmt_mut(self, stmt);
    }

    // Nested functions and closures are not part of the transaction's body.
    fn visit_item_mut(&mut self, _: &mut Item) {}
    fn visit_expr_closure_mut(&mut self, _: &mut syn::ExprClosure) {}
}
