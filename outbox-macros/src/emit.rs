//! Finding and rewriting `emit!` in the body of a `#[transactional_outbox]` method.
//!
//! In the method body itself, `emit!(event)` becomes a push onto the method's list of emitted events
//! (written with one multi-row insert just before commit). Where the event could escape the transaction
//! (a closure or an `async` block, which may run after the method committed) or where the rewrite cannot
//! reach (another macro's input), it becomes one error saying why and what to do. When the method itself
//! is wrong, every `emit!` is neutralised instead, so the one setup error is the only error.

use proc_macro2::{Group, Ident, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Block, Expr, Token};

/// How `emit!` is rewritten.
#[derive(Clone, PartialEq, Eq)]
pub enum Mode {
    /// Push the event onto the method's emitted list.
    Rewrite,
    /// Evaluate the event expression and do nothing else: the method has a setup error already.
    Neutralise,
    /// An error: the method (named here) is `#[read_only]`.
    ReadOnly(String),
}

/// Where an `emit!` sits relative to the method body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Body,
    Closure,
    AsyncBlock,
}

/// The identifiers the generated code shares between the wrapper and the rewritten `emit!`s.
pub struct Names {
    /// The method's unit of work, which collects its emitted events.
    pub unit: Ident,
    /// The support module (`::outbox_seaorm::__private`).
    pub private: TokenStream,
    /// The method's error type, where a failed `emit!` converts its `DbErr` (so that a missing
    /// `From<DbErr>` is reported there, once, like the begin and commit around the body).
    pub error_span: Span,
    /// The error type, when the return type spells it (`Result<T, E>`): a failed `emit!` then keeps the
    /// outbox's typed error if `E: From<outbox_seaorm::Error>`. `None` for an alias such as `Result<T>`.
    pub error_type: Option<syn::Type>,
}

impl Names {
    /// The support module's path spanned at `span`, so an unmet bound of a support function is reported
    /// at the user's code it was generated for (and once).
    pub fn private_at(&self, span: Span) -> TokenStream {
        respan(self.private.clone(), span)
    }
}

/// `tokens` with every token spanned at `span`.
pub fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// Rewrites every `emit!` of `block` per `mode`; `crate_names` are the names `emit!` may be qualified
/// with (`outbox_seaorm::emit!`).
pub fn rewrite(block: &mut Block, mode: Mode, names: &Names, crate_names: &[String]) {
    let mut rewriter = Rewriter { mode: &mode, names, crate_names, place: Place::Body };
    rewriter.visit_block_mut(block);
}

/// Whether `block` uses `emit!` anywhere outside nested items.
pub fn uses_emit(block: &Block, crate_names: &[String]) -> bool {
    struct Finder<'a>(bool, &'a [String]);
    impl<'ast> syn::visit::Visit<'ast> for Finder<'_> {
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            self.0 |= is_emit(&mac.path, self.1) || tokens_use_emit(mac.tokens.clone());
        }
        fn visit_item(&mut self, _: &'ast syn::Item) {}
    }
    let mut finder = Finder(false, crate_names);
    syn::visit::Visit::visit_block(&mut finder, block);
    finder.0
}

/// Whether `path` names this crate's `emit!`: `emit`, or `<crate>::emit` for one of `crate_names`.
fn is_emit(path: &syn::Path, crate_names: &[String]) -> bool {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    match segments.as_slice() {
        [only] => only == "emit" && path.leading_colon.is_none(),
        [krate, last] => last == "emit" && crate_names.iter().any(|c| c == krate),
        _ => false,
    }
}

fn tokens_use_emit(tokens: TokenStream) -> bool {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    tokens.iter().enumerate().any(|(i, token)| match token {
        TokenTree::Ident(ident) => ident == "emit" && is_bang(tokens.get(i + 1)),
        TokenTree::Group(group) => tokens_use_emit(group.stream()),
        _ => false,
    })
}

fn is_bang(token: Option<&TokenTree>) -> bool {
    matches!(token, Some(TokenTree::Punct(p)) if p.as_char() == '!')
}

/// `emit!(event)` or `emit!(event, headers = [("name", value), …])`.
struct EmitArgs {
    event: Expr,
    headers: Option<Expr>,
}

impl Parse for EmitArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let event: Expr = input.parse()?;
        let mut headers = None;
        if input.parse::<Option<Token![,]>>()?.is_some() && !input.is_empty() {
            let key: syn::Ident = input.parse()?;
            if key != "headers" {
                return Err(syn::Error::new(
                    key.span(),
                    format!("unknown `emit!` argument `{key}`; expected `headers = [(\"name\", value), …]`"),
                ));
            }
            input.parse::<Token![=]>()?;
            headers = Some(input.parse()?);
            input.parse::<Option<Token![,]>>()?;
        }
        if !input.is_empty() {
            return Err(input.error("`emit!` takes one event and optionally `headers = …`"));
        }
        Ok(EmitArgs { event, headers })
    }
}

struct Rewriter<'a> {
    mode: &'a Mode,
    names: &'a Names,
    crate_names: &'a [String],
    place: Place,
}

impl Rewriter<'_> {
    fn replacement(&self, mac: &syn::Macro) -> Expr {
        let span = mac.path.span();
        let refuse = |message: &str| match mac.parse_body::<EmitArgs>() {
            Ok(args) => refused(span, message, Some(&args.event)),
            Err(error) => error.into_compile_error(),
        };
        let tokens = match (self.mode, self.place) {
            (Mode::Neutralise, _) => match mac.parse_body::<EmitArgs>() {
                Ok(args) => {
                    let event = &args.event;
                    quote_spanned! {span=> { let _ = &(#event); } }
                }
                Err(_) => quote!({}),
            },
            (Mode::ReadOnly(method), _) => refuse(&format!(
                "`{method}` is `#[read_only]`: it runs without a transaction of its own, so it cannot emit events. Remove `#[read_only]` from `{method}` (its events then commit with its writes)"
            )),
            (Mode::Rewrite, Place::Closure) => refuse(
                "`emit!` inside a closure is not part of the method's transaction: the closure may be called after the method committed, and its event would be lost. Return the event from the closure and emit it in the method body (`for event in events { emit!(event); }`)",
            ),
            (Mode::Rewrite, Place::AsyncBlock) => refuse(
                "`emit!` inside an `async` block is not part of the method's transaction: the block may run (or be spawned) after the method committed, and its event would be lost. Await the block and emit its result in the method body (`let event = async { … }.await; emit!(event);`)",
            ),
            (Mode::Rewrite, Place::Body) => match mac.parse_body::<EmitArgs>() {
                Ok(args) => self.push(&args),
                Err(error) => error.into_compile_error(),
            },
        };
        // The user's `emit` path is still invoked (its no-op arm), so a `use outbox_seaorm::emit;` stays used.
        // Spanned as generated code (at the `emit!`), so lints do not take the wrapper for the user's.
        let path = &mac.path;
        let generated = Span::mixed_site().located_at(span);
        let tokens = quote_spanned! {generated=> { #path!(@used); #tokens } };
        syn::parse2(tokens).unwrap_or_else(|e| Expr::Verbatim(e.into_compile_error()))
    }

    fn push(&self, args: &EmitArgs) -> TokenStream {
        let event = &args.event;
        let span = event.span();
        let mut unit = self.names.unit.clone();
        unit.set_span(unit.span().located_at(span));
        let private = self.names.private_at(span);
        let recorded = match &args.headers {
            None => quote_spanned! {span=>
                #private::emit(&#unit, #private::event_ref(&(#event)))
            },
            Some(headers) => quote_spanned! {span=>
                #private::emit_with_headers(&#unit, #private::event_ref(&(#event)), #headers)
            },
        };
        let error_span = self.names.error_span;
        let at_error = self.names.private_at(error_span);
        let absorb = match &self.names.error_type {
            Some(error_type) => quote_spanned! {error_span=> {
                #[allow(unused_imports)]
                use #at_error::{ViaDbErr as _, ViaNothing as _, ViaOutboxError as _};
                (&&&#at_error::Absorb::<#error_type>::new()).absorb(error)
            }},
            None => quote_spanned! {error_span=> #at_error::AbsorbsDbErr::absorb(#at_error::db_err(error)) },
        };
        quote_spanned! {span=>
            if let ::std::result::Result::Err(error) = #recorded {
                return ::std::result::Result::Err(#absorb);
            }
        }
    }

    /// Another macro's input: each `emit ! (…)` in it becomes an error (the rewrite cannot see inside).
    fn foreign_macro(&self, mac: &mut syn::Macro) {
        if *self.mode != Mode::Neutralise && tokens_use_emit(mac.tokens.clone()) {
            let name = mac.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
            mac.tokens = replace_emits(std::mem::take(&mut mac.tokens), &name);
        }
    }

    fn nested(&mut self, place: Place, visit: impl FnOnce(&mut Self)) {
        let outer = std::mem::replace(&mut self.place, place);
        visit(self);
        self.place = outer;
    }
}

/// The error for an `emit!` that cannot be rewritten where it is; the event stays evaluated (and its type
/// named), so the error is the only diagnostic: no unused import or variable on top.
fn refused(span: Span, message: &str, event: Option<&Expr>) -> TokenStream {
    let event = event.map(|event| quote_spanned! {span=> let _ = &(#event); });
    quote_spanned! {span=> { ::std::compile_error!(#message); #event } }
}

/// `tokens` with each `emit ! (…)` replaced by a spanned error naming the macro `inside`.
fn replace_emits(tokens: TokenStream, inside: &str) -> TokenStream {
    let message = format!(
        "`emit!` inside `{inside}!` is not rewritten by `#[transactional_outbox]` (it cannot see into another macro's input): move the `emit!` out of `{inside}!`, into the method body"
    );
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = TokenStream::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Ident(ident)
                if ident == "emit"
                    && is_bang(tokens.get(i + 1))
                    && matches!(tokens.get(i + 2), Some(TokenTree::Group(_))) =>
            {
                let event = match &tokens[i + 2] {
                    TokenTree::Group(group) => syn::parse2::<EmitArgs>(group.stream()).ok().map(|args| args.event),
                    _ => None,
                };
                out.extend(refused(ident.span(), &message, event.as_ref()));
                i += 3;
            }
            TokenTree::Group(group) => {
                let mut replaced = Group::new(group.delimiter(), replace_emits(group.stream(), inside));
                replaced.set_span(group.span());
                out.extend([TokenTree::Group(replaced)]);
                i += 1;
            }
            other => {
                out.extend([other.clone()]);
                i += 1;
            }
        }
    }
    out
}

impl VisitMut for Rewriter<'_> {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        if let Expr::Macro(m) = expr {
            if is_emit(&m.mac.path, self.crate_names) {
                *expr = self.replacement(&m.mac);
            } else {
                self.foreign_macro(&mut m.mac);
            }
            return;
        }
        syn::visit_mut::visit_expr_mut(self, expr);
    }

    fn visit_stmt_mut(&mut self, stmt: &mut syn::Stmt) {
        if let syn::Stmt::Macro(m) = stmt {
            if is_emit(&m.mac.path, self.crate_names) {
                let expr = self.replacement(&m.mac);
                *stmt = syn::Stmt::Expr(expr, Some(m.semi_token.unwrap_or_default()));
            } else {
                self.foreign_macro(&mut m.mac);
            }
            return;
        }
        syn::visit_mut::visit_stmt_mut(self, stmt);
    }

    fn visit_expr_closure_mut(&mut self, closure: &mut syn::ExprClosure) {
        self.nested(Place::Closure, |v| syn::visit_mut::visit_expr_closure_mut(v, closure));
    }

    fn visit_expr_async_mut(&mut self, block: &mut syn::ExprAsync) {
        self.nested(Place::AsyncBlock, |v| syn::visit_mut::visit_expr_async_mut(v, block));
    }

    // A nested function is not part of the transaction: its `emit!` is the macro's own error (or its own
    // `#[transactional_outbox]` rewrites it).
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}
