//! `#[transactional_outbox]`: run a service method in a transaction and write its `emit!`s there.
//!
//! Parse the arguments, then per method validate its shape and rewrite its body. A method that fails
//! validation is emitted unchanged apart from its `emit!`s, which are neutralised, so each mistake gives
//! exactly one error.
//!
//! The rewritten body asks the runtime (`__private::begin`) for its transaction: the task's current outbox
//! transaction on the same database (joined with a savepoint) or a new one, so annotated methods compose
//! whatever shape their connection has. A `#[read_only]` method gets no transaction of its own.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Block, Expr, Ident, ImplItem, Item, ReturnType, Signature, Token, Type};

use crate::connection::{self, ConnectionParam};
use crate::diagnostics::{Errors, with_item};
use crate::emit::{self, Mode, Names};
use crate::signature::result_types;

/// `#[transactional_outbox]` or `#[transactional_outbox(conn = <expression>)]`.
#[derive(Default)]
struct Args {
    /// Where the connection comes from when it is not a parameter: `self.db`, `state.db`, an `Arc`.
    conn: Option<Expr>,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            if key != "conn" {
                return Err(syn::Error::new(
                    key.span(),
                    format!("unknown argument `{key}`; expected `conn = <expression>`, such as `conn = self.db`"),
                ));
            }
            if args.conn.is_some() {
                return Err(syn::Error::new(key.span(), "`conn` is given twice"));
            }
            input.parse::<Token![=]>()?;
            args.conn = Some(input.parse()?);
            input.parse::<Option<Token![,]>>()?;
        }
        Ok(args)
    }
}

/// What the expansion of one attribute shares between its methods.
struct Context {
    args: Args,
    seaorm: TokenStream,
    crate_names: Vec<String>,
}

impl Context {
    /// The names generated code shares; `error_span` is where the method's error type is written, and
    /// `error_type` that type when the return type spells it.
    fn names(&self, error_span: Span, error_type: Option<syn::Type>) -> Names {
        let seaorm = &self.seaorm;
        Names {
            unit: Ident::new("__outbox_unit", Span::mixed_site()),
            private: quote!(#seaorm::__private),
            error_span,
            error_type,
        }
    }

    fn neutralise(&self, block: &mut Block) {
        emit::rewrite(block, Mode::Neutralise, &self.names(Span::call_site(), None), &self.crate_names);
    }
}

/// The marker of a method that only reads: `#[read_only]`, removed from the method.
fn take_read_only(attrs: &mut Vec<Attribute>) -> Option<Attribute> {
    let index = attrs.iter().position(|a| a.path().is_ident(READ_ONLY))?;
    Some(attrs.remove(index))
}

const READ_ONLY: &str = "read_only";

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let (seaorm, crate_names) = crate::paths::seaorm();
    let parsed_args = syn::parse2::<Args>(args);
    let Ok(parsed) = syn::parse2::<Item>(item.clone()) else {
        let error = syn::Error::new(
            Span::call_site(),
            "`#[transactional_outbox]` goes on an inherent `impl` block or on an `async fn`",
        );
        return with_item(item, error);
    };
    let cx = Context { args: Args::default(), seaorm, crate_names };
    let args = match parsed_args {
        Ok(args) => args,
        Err(error) => return neutralised(parsed, &cx, error),
    };
    let cx = Context { args, ..cx };
    match parsed {
        Item::Impl(mut block) => {
            if let Some((_, path, _)) = &block.trait_ {
                let error = syn::Error::new_spanned(
                    path,
                    "`#[transactional_outbox]` goes on an inherent impl block (`impl Service { … }`), not a trait impl; put it on the methods of the inherent impl instead",
                );
                return neutralised(Item::Impl(block), &cx, error);
            }
            let mut errors = Errors::default();
            for member in &mut block.items {
                let ImplItem::Fn(method) = member else { continue };
                let read_only = take_read_only(&mut method.attrs);
                let takes_self = method.sig.receiver().is_some();
                let wanted = read_only.is_some()
                    || match &cx.args.conn {
                        Some(_) => takes_self && method.sig.asyncness.is_some(),
                        None => connection::find(&method.sig).is_some(),
                    };
                if wanted {
                    if let Err(error) = rewrite(&mut method.sig, &mut method.block, &cx, read_only.is_some()) {
                        allow_unused(&mut method.attrs);
                        errors.push(error);
                    }
                } else if emit::uses_emit(&method.block, &cx.crate_names) {
                    errors.push(missing_connection(&method.sig));
                    allow_unused(&mut method.attrs);
                    cx.neutralise(&mut method.block);
                }
            }
            finish(block.into_token_stream(), errors)
        }
        Item::Fn(mut function) => {
            let read_only = take_read_only(&mut function.attrs);
            let mut errors = Errors::default();
            if let Err(error) = rewrite(&mut function.sig, &mut function.block, &cx, read_only.is_some()) {
                allow_unused(&mut function.attrs);
                errors.push(error);
            }
            finish(function.into_token_stream(), errors)
        }
        other => {
            let error = syn::Error::new_spanned(
                &other,
                "`#[transactional_outbox]` goes on an inherent `impl` block or on an `async fn`",
            );
            with_item(other.into_token_stream(), error)
        }
    }
}

fn finish(item: TokenStream, errors: Errors) -> TokenStream {
    match errors.finish() {
        Ok(()) => item,
        Err(error) => with_item(item, error),
    }
}

/// A method left with a setup error no longer uses its connection: no warning on top of the error.
fn allow_unused(attrs: &mut Vec<Attribute>) {
    attrs.push(syn::parse_quote!(#[allow(unused)]));
}

/// The item with every `emit!` neutralised, plus `error`.
fn neutralised(mut item: Item, cx: &Context, error: syn::Error) -> TokenStream {
    match &mut item {
        Item::Impl(block) => {
            for member in &mut block.items {
                if let ImplItem::Fn(method) = member {
                    take_read_only(&mut method.attrs);
                    allow_unused(&mut method.attrs);
                    cx.neutralise(&mut method.block);
                }
            }
        }
        Item::Fn(function) => {
            take_read_only(&mut function.attrs);
            allow_unused(&mut function.attrs);
            cx.neutralise(&mut function.block);
        }
        _ => {}
    }
    with_item(item.into_token_stream(), error)
}

/// The error of a method that needs a connection and has none: a parameter that holds one in an `Arc`
/// (which the macro cannot widen) gets the two forms that work.
fn missing_connection(sig: &Signature) -> syn::Error {
    let ident = &sig.ident;
    if let Some((param, wrapper)) = connection::find_wrapped(sig) {
        return syn::Error::new(
            param.span(),
            format!(
                "`{param}` holds the connection in {} `{wrapper}`, which `#[transactional_outbox]` cannot run `{ident}` on: name it with `#[transactional_outbox(conn = {param})]` (the body's `{param}` then names the transaction), or take `{param}: &DatabaseConnection` (a caller holding the `{wrapper}` passes `&*{param}`)",
                if wrapper.starts_with(['A', 'E', 'I', 'O', 'U', 'R']) { "an" } else { "a" }
            ),
        );
    }
    syn::Error::new(
        ident.span(),
        format!(
            "`{ident}` emits events but takes no SeaORM connection: add a parameter such as `db: &DatabaseConnection` (or `&DatabaseTransaction`), or name where the connection is with `#[transactional_outbox(conn = self.db)]`, so the events join its transaction"
        ),
    )
}

/// Where the method's transaction begins from.
enum Source<'a> {
    Param(ConnectionParam),
    Expr(&'a Expr),
}

/// Validates the method; on success rewrites its body (and widens a `&DatabaseConnection` parameter),
/// otherwise neutralises its `emit!`s and returns every error.
fn rewrite(sig: &mut Signature, block: &mut Block, cx: &Context, read_only: bool) -> syn::Result<()> {
    let source = match &cx.args.conn {
        Some(expr) => Some(Source::Expr(expr)),
        None => connection::find(sig).map(Source::Param),
    };
    let mut errors = Errors::default();
    if source.is_none() {
        errors.push(missing_connection(sig));
    }
    if !read_only {
        if sig.asyncness.is_none() {
            errors.at(
                sig.fn_token,
                format!("`{}` must be `async fn`: the transaction is awaited around its body", sig.ident),
            );
        }
        if matches!(sig.output, ReturnType::Default) {
            errors.at(
                &sig.ident,
                format!(
                    "`{}` must return `Result<T, E>` with `E: From<sea_orm::DbErr>`: `Ok` commits the transaction and its events, `Err` rolls both back",
                    sig.ident
                ),
            );
        }
    }
    let Some(source) = source else {
        cx.neutralise(block);
        return errors.finish();
    };
    if let Err(error) = errors.finish() {
        cx.neutralise(block);
        return Err(error);
    }

    // Every place that needs `E: From<DbErr>` is spanned at the user's error type (or the whole return
    // type when it is an alias such as `Result<T>`), so a missing conversion is reported once, there.
    let error_span = match &sig.output {
        ReturnType::Type(_, ty) => result_types(&sig.output).map_or_else(|| ty.span(), |(_, err)| err.span()),
        ReturnType::Default => Span::call_site(),
    };
    let error_type = result_types(&sig.output).map(|(_, error)| error.clone());
    let names = cx.names(error_span, error_type);
    let mut body = block.clone();
    let mode = if read_only { Mode::ReadOnly(sig.ident.to_string()) } else { Mode::Rewrite };
    emit::rewrite(&mut body, mode, &names, &cx.crate_names);
    let txn = Ident::new("__outbox_txn", Span::mixed_site());
    let (connection, rebind) = match &source {
        Source::Param(param) => {
            // The type as written stays named in the body, so its import is still used.
            let written = connection::generalise(sig, param, &cx.seaorm);
            let ident = &param.ident;
            let written = written.map(|ty| quote! { let _ = ::core::marker::PhantomData::<#ty>; });
            let rebind = quote! {
                #[allow(unused_variables)]
                let #ident = #txn;
                #written
            };
            (quote!(#ident), rebind)
        }
        Source::Expr(expr) => {
            ReplaceConnection { conn: expr.to_token_stream().to_string(), txn: &txn }.visit_block_mut(&mut body);
            let span = expr.span();
            let at_conn = names.private_at(span);
            (quote_spanned! {span=> #at_conn::AsConnection::as_connection(&(#expr)) }, TokenStream::new())
        }
    };
    let stmts = &body.stmts;
    let private = &names.private;
    let tokens = if read_only {
        let reader = Ident::new("__outbox_reader", Span::mixed_site());
        let executor = Ident::new("__outbox_executor", Span::mixed_site());
        quote! {
            {
                let #reader = #private::reader(#connection);
                let #executor = #reader.executor();
                #[allow(unused_variables)]
                let #txn = #private::stand_in(#connection, &#executor);
                #rebind
                #(#stmts)*
            }
        }
    } else {
        // Checked above: a method that is not `#[read_only]` returns a type.
        let ReturnType::Type(_, ret_ty) = &sig.output else { return Ok(()) };
        transactional_body(&names, &connection, &txn, &rebind, ret_ty, stmts)
    };
    *block = syn::parse2(tokens)?;
    Ok(())
}

/// The body of a method that runs in a transaction: begin (or join), run the body as the task's
/// current outbox transaction, then write the events and commit, or roll back.
fn transactional_body(
    names: &Names,
    connection: &TokenStream,
    txn: &Ident,
    rebind: &TokenStream,
    ret_ty: &Type,
    stmts: &[syn::Stmt],
) -> TokenStream {
    let err_span = names.error_span;
    let private = names.private_at(err_span);
    let unit = located(&names.unit, err_span);
    let result = Ident::new("__outbox_result", Span::mixed_site().located_at(err_span));
    let begin = quote_spanned! {err_span=>
        match #private::begin(#connection).await {
            ::std::result::Result::Ok(unit) => unit,
            ::std::result::Result::Err(error) => {
                return ::std::result::Result::Err(#private::AbsorbsDbErr::absorb(error));
            }
        }
    };
    let finish = quote_spanned! {err_span=>
        #private::finish(#unit, { #result }).await
    };
    let unit = &names.unit;
    let private_plain = &names.private;
    quote! {
        {
            let #unit = #begin;
            let #result: #ret_ty = #unit.scope(async {
                #[allow(unused_variables)]
                let #txn = #private_plain::stand_in(#connection, #unit.txn());
                #rebind
                #(#stmts)*
            })
            .await;
            #finish
        }
    }
}

/// `ident` (same name, same hygiene) reported at `span`.
fn located(ident: &Ident, span: Span) -> Ident {
    let mut moved = ident.clone();
    moved.set_span(ident.span().located_at(span));
    moved
}

/// Replaces the `conn = …` expression in the body by the transaction, so the body's own
/// `&self.db` (or `&*self.db`, `self.db.as_ref()` for an `Arc`) runs inside it.
struct ReplaceConnection<'a> {
    conn: String,
    /// A reference to the transaction (or, in a `#[read_only]` method, to the executor).
    txn: &'a Ident,
}

impl ReplaceConnection<'_> {
    fn is_conn(&self, expr: &Expr) -> bool {
        expr.to_token_stream().to_string() == self.conn
    }
}

impl VisitMut for ReplaceConnection<'_> {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        let txn = |span: Span| located(self.txn, span);
        let replacement: Option<Expr> = match &*expr {
            e if self.is_conn(e) => {
                let txn = txn(e.span());
                Some(syn::parse_quote_spanned!(e.span()=> (*#txn)))
            }
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) && self.is_conn(&u.expr) => {
                let txn = txn(u.span());
                Some(syn::parse_quote_spanned!(u.span()=> (*#txn)))
            }
            Expr::MethodCall(m) if m.args.is_empty() && m.method == "as_ref" && self.is_conn(&m.receiver) => {
                let txn = txn(m.span());
                Some(syn::parse_quote_spanned!(m.span()=> (#txn)))
            }
            _ => None,
        };
        match replacement {
            Some(replacement) => *expr = replacement,
            None => syn::visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}
}
