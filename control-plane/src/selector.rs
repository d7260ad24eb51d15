//! Kubernetes label and field selectors.
//!
//! [`LabelSelector`] follows `k8s.io/apimachinery/pkg/labels`: the same
//! grammar, the same matching rules, the same canonical string form and the
//! same error texts (clients see them in 400 responses).
//!
//! [`FieldSelector`] follows `k8s.io/apimachinery/pkg/fields.ParseSelector`.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde_json::Value;

use crate::validation::{self, FieldError};

/// Why a selector was rejected. The `Display` text is what upstream reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector requirement could not be parsed or is invalid.
    #[error("unable to parse requirement: {0}")]
    UnparsableRequirement(String),
    /// The label selector string is malformed between requirements.
    #[error("{0}")]
    LabelSyntax(String),
    /// A requirement built from an API `LabelSelector` is invalid.
    #[error("{0}")]
    InvalidRequirement(String),
    /// An API `LabelSelector` expression used an unknown operator.
    #[error("{} is not a valid label selector operator", validation::go_quote(.0))]
    InvalidOperator(String),
    /// A field selector term has no `=`, `==` or `!=`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    InvalidFieldTerm { selector: String, term: String },
    /// A backslash in a field selector value is not followed by `\`, `,` or `=`.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    InvalidEscapeSequence(String),
    /// A field selector value contains an unescaped `,` or `=`
    /// (upstream prints the character's code point).
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.0))]
    UnescapedCharacter(char),
}

// ---------------------------------------------------------------------------
// label selector: requirements
// ---------------------------------------------------------------------------

/// A label selector operator (upstream `selection.Operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One requirement of a label selector; all requirements must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement after checking it as upstream's `NewRequirement`:
    /// the key must be a qualified name, the values valid label values, and
    /// the number of values must suit the operator.
    pub fn new(
        key: &str,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        let errs = requirement_errors(key, operator, &values, Value::from(values.clone()));
        if !errs.is_empty() {
            return Err(SelectorError::InvalidRequirement(
                validation::aggregate_message(&errs),
            ));
        }
        Ok(Requirement {
            key: key.to_string(),
            operator,
            values,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    pub fn values(&self) -> &[String] {
        &self.values
    }

    fn has_value(&self, value: &str) -> bool {
        self.values.iter().any(|v| v == value)
    }

    /// Whether this requirement holds for the given labels.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.key);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                actual.is_some_and(|v| self.has_value(v))
            }
            Operator::NotIn | Operator::NotEquals => actual.is_none_or(|v| !self.has_value(v)),
            Operator::Exists => actual.is_some(),
            Operator::DoesNotExist => actual.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(actual) = actual.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let [wanted] = self.values.as_slice() else {
                    return false;
                };
                let Ok(wanted) = wanted.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > wanted
                } else {
                    actual < wanted
                }
            }
        }
    }
}

/// The checks of upstream's `NewRequirement`, with its field paths ("key",
/// "values", "values[i][key]"). `shown_values` is how the value list appears
/// in messages.
fn requirement_errors(
    key: &str,
    operator: Operator,
    values: &[String],
    shown_values: Value,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(e) = key_error(key, "key") {
        errs.push(e);
    }
    match operator {
        Operator::In | Operator::NotIn => {
            if values.is_empty() {
                errs.push(FieldError::invalid(
                    "values",
                    shown_values,
                    "for 'in', 'notin' operators, values set can't be empty",
                ));
            }
        }
        Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
            if values.len() != 1 {
                errs.push(FieldError::invalid(
                    "values",
                    shown_values,
                    "exact-match compatibility requires one single value",
                ));
            }
        }
        Operator::Exists | Operator::DoesNotExist => {
            if !values.is_empty() {
                errs.push(FieldError::invalid(
                    "values",
                    shown_values,
                    "values set must be empty for exists and does not exist",
                ));
            }
        }
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                errs.push(FieldError::invalid(
                    "values",
                    shown_values,
                    "for 'Gt', 'Lt' operators, exactly one value is required",
                ));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(FieldError::invalid(
                        format!("values[{i}]"),
                        v.as_str(),
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    ));
                }
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let msgs = validation::label_value(v);
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(
                format!("values[{i}][{key}]"),
                v.as_str(),
                msgs.join("; "),
            ));
        }
    }
    errs
}

/// Upstream's `validateLabelKey`.
fn key_error(key: &str, path: &str) -> Option<FieldError> {
    let msgs = validation::qualified_name(key);
    if msgs.is_empty() {
        None
    } else {
        Some(FieldError::invalid(path, key, msgs.join("; ")))
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let (op, parens) = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => ("=", false),
            Operator::DoubleEquals => ("==", false),
            Operator::NotEquals => ("!=", false),
            Operator::In => (" in ", true),
            Operator::NotIn => (" notin ", true),
            Operator::GreaterThan => (">", false),
            Operator::LessThan => ("<", false),
        };
        f.write_str(op)?;
        if parens {
            f.write_str("(")?;
        }
        let mut sorted: Vec<&str> = self.values.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        f.write_str(&sorted.join(","))?;
        if parens {
            f.write_str(")")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// label selector
// ---------------------------------------------------------------------------

/// A parsed label selector: the AND of its requirements, kept sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the string form used by `?labelSelector=`, e.g.
    /// `app=web,tier in (a,b),!legacy`. An empty string selects everything.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut parser = Parser::new(s);
        let requirements = parser.parse()?;
        Ok(LabelSelector::from_requirements(requirements))
    }

    /// Converts an API `LabelSelector` (matchLabels + matchExpressions), as
    /// upstream's `metav1.LabelSelectorAsSelector`. An empty one selects everything.
    pub fn from_api(sel: &metav1::LabelSelector) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            requirements.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        for expr in sel.match_expressions.iter().flatten() {
            let operator = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(SelectorError::InvalidOperator(other.to_string())),
            };
            let values = expr.values.clone().unwrap_or_default();
            // upstream copies the values with append(nil, ...), so an empty
            // list shows up as null in messages
            let shown = if values.is_empty() {
                Value::Null
            } else {
                Value::from(values.clone())
            };
            let errs = requirement_errors(&expr.key, operator, &values, shown);
            if !errs.is_empty() {
                return Err(SelectorError::InvalidRequirement(
                    validation::aggregate_message(&errs),
                ));
            }
            requirements.push(Requirement {
                key: expr.key.clone(),
                operator,
                values,
            });
        }
        Ok(LabelSelector::from_requirements(requirements))
    }

    /// Builds a selector from already-checked requirements.
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> LabelSelector {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// The selector that matches every object.
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }

    /// True when the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether every requirement holds for the given labels.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// `Some(value)` when the selector requires `key` to have exactly that
    /// value (`key=value`, `key==value` or `key in (value)`), as upstream's
    /// `RequiresExactMatch`.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| r.key == key)?;
        match (r.operator, r.values.as_slice()) {
            (Operator::Equals | Operator::DoubleEquals | Operator::In, [v]) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// label selector: lexer and parser
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// Tokens that are spelled with special characters or are keywords.
fn literal_token(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Byte-wise lexer. As upstream, a NUL byte reads like the end of input.
struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    fn scan_id_or_keyword(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut end = start;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            end = self.pos;
        }
        let word = &self.s[start..end];
        let tok = match literal_token(word) {
            Some(t) => t,
            None => Token::Identifier,
        };
        (tok, Self::text(word))
    }

    fn scan_special_symbol(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut last: Option<(Token, usize)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special(ch) {
                self.unread();
                break;
            }
            match literal_token(&self.s[start..self.pos]) {
                Some(tok) => last = Some((tok, self.pos)),
                None if last.is_some() => {
                    self.unread();
                    break;
                }
                None => {}
            }
        }
        match last {
            Some((tok, end)) => (tok, Self::text(&self.s[start..end])),
            // every single special character is a token, so this cannot
            // happen; treat it as an unusable identifier-free token
            None => (Token::EndOfString, String::new()),
        }
    }

    fn lex(&mut self) -> (Token, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special(ch) {
            self.scan_special_symbol()
        } else {
            self.scan_id_or_keyword()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

const BINARY_OPERATORS: &str = "in, notin, =, ==, !=, gt, lt";

impl Parser {
    fn new(s: &str) -> Parser {
        let mut lexer = Lexer {
            s: s.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let (tok, lit) = lexer.lex();
            items.push((tok, lit));
            if tok == Token::EndOfString {
                break;
            }
        }
        Parser { items, position: 0 }
    }

    fn item(&self, index: usize, ctx: Context) -> (Token, String) {
        let (tok, lit) = self
            .items
            .get(index)
            .cloned()
            .unwrap_or((Token::EndOfString, String::new()));
        let tok = match (ctx, tok) {
            (Context::Values, Token::In | Token::NotIn) => Token::Identifier,
            _ => tok,
        };
        (tok, lit)
    }

    fn lookahead(&self, ctx: Context) -> (Token, String) {
        self.item(self.position, ctx)
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        let item = self.item(self.position, ctx);
        self.position += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(SelectorError::UnparsableRequirement)?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(SelectorError::LabelSyntax(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::LabelSyntax(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )))
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(SelectorError::LabelSyntax(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )))
                }
            }
        }
    }

    /// Errors are returned as plain text; the caller prefixes
    /// "unable to parse requirement: ".
    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = inferred {
            return new_parsed_requirement(key, op, Vec::new());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_parsed_requirement(key, operator, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut operator = None;
        let (mut tok, mut lit) = self.consume(Context::Values);
        if tok == Token::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        // upstream validates the key here with a nil field path
        if let Some(e) = key_error(&lit, "<nil>") {
            return Err(e.message());
        }
        let (next, _) = self.lookahead(Context::Values);
        if matches!(next, Token::EndOfString | Token::Comma) && operator.is_none() {
            operator = Some(Operator::Exists);
        }
        Ok((lit, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => return Err(format!("found '{lit}', expected: {BINARY_OPERATORS}")),
        })
    }

    /// `(a,b,c)`; returns a sorted set. `()` is the set with the empty value.
    fn parse_values(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let set = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Context::Values);
                if tok != Token::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// A possibly empty list of comma-separated, possibly empty identifiers.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    set.insert(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set.into_iter().collect()),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new()); // "(,"
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Token::ClosedPar {
                        set.insert(String::new()); // ",)"
                        return Ok(set.into_iter().collect());
                    }
                    if tok2 == Token::Comma {
                        self.consume(Context::Values);
                        set.insert(String::new()); // ",,"
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    /// The single value after `=`, `==`, `!=`, `>` or `<`; may be empty.
    fn parse_exact_value(&mut self) -> Result<Vec<String>, String> {
        let (tok, _) = self.lookahead(Context::Values);
        if matches!(tok, Token::EndOfString | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            Ok(vec![lit])
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

fn new_parsed_requirement(
    key: String,
    operator: Operator,
    values: Vec<String>,
) -> Result<Requirement, String> {
    Requirement::new(&key, operator, values).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// field selector
// ---------------------------------------------------------------------------

/// Field selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `=` or `==`
    Equals,
    /// `!=`
    NotEquals,
}

/// One `field=value` or `field!=value` term (value unescaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub operator: FieldOperator,
    pub value: String,
}

/// A parsed field selector: the AND of its terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `?fieldSelector=`: terms separated by unescaped ',', each
    /// `field=value`, `field==value` or `field!=value`, where the value may
    /// contain `\,`, `\=` and `\\`. Nothing is trimmed. An empty string selects
    /// everything.
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        let mut parts = split_terms(s);
        parts.sort_unstable();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, operator, raw_value)) = split_term(part) else {
                return Err(SelectorError::InvalidFieldTerm {
                    selector: s.to_string(),
                    term: part.to_string(),
                });
            };
            terms.push(FieldRequirement {
                field: field.to_string(),
                operator,
                value: unescape_value(raw_value)?,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// The selector that matches every object.
    pub fn everything() -> FieldSelector {
        FieldSelector::default()
    }

    /// True when the selector has no terms (matches everything).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The field names used, in term order (may repeat).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|t| t.field.as_str())
    }

    /// The terms, sorted as upstream sorts them.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.terms
    }

    /// Whether every term holds; `get(field)` returns the object's value for a
    /// field, `None` counting as the empty string.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.terms.iter().all(|t| {
            let actual = get(&t.field).unwrap_or_default();
            match t.operator {
                FieldOperator::Equals => actual == t.value,
                FieldOperator::NotEquals => actual != t.value,
            }
        })
    }

    /// `Some(v)` when the selector requires `field == v`.
    pub fn exact_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && t.operator == FieldOperator::Equals)
            .map(|t| t.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = match t.operator {
                FieldOperator::Equals => "=",
                FieldOperator::NotEquals => "!=",
            };
            write!(f, "{}{op}{}", t.field, escape_field_value(&t.value))?;
        }
        Ok(())
    }
}

/// Escapes `\`, `,` and `=` in a field selector value.
pub fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Splits at commas not preceded by an escaping backslash; the backslashes stay.
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits a term at the first operator (`!=`, `==` or `=`, tried in that
/// order at each position). The field part supports no escaping.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, operator) in [
            ("!=", FieldOperator::NotEquals),
            ("==", FieldOperator::Equals),
            ("=", FieldOperator::Equals),
        ] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], operator, value));
            }
        }
    }
    None
}

fn unescape_value(s: &str) -> Result<String, SelectorError> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => return Err(SelectorError::InvalidEscapeSequence(format!("\\{c}"))),
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => return Err(SelectorError::UnescapedCharacter(c)),
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::InvalidEscapeSequence("\\".to_string()));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use metav1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap()
    }

    fn err(s: &str) -> String {
        LabelSelector::parse(s).unwrap_err().to_string()
    }

    const VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    const KEY_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

    #[test]
    fn empty_selects_everything() {
        for s in ["", "   ", "\t\n"] {
            let s = sel(s);
            assert!(s.is_empty());
            assert!(s.matches(&labels(&[])));
            assert_eq!(s.to_string(), "");
        }
        assert!(LabelSelector::everything().is_empty());
        assert_eq!(LabelSelector::everything(), sel(""));
    }

    #[test]
    fn operators_parse() {
        let cases: &[(&str, Operator, &[&str])] = &[
            ("a", Operator::Exists, &[]),
            ("!a", Operator::DoesNotExist, &[]),
            ("a=b", Operator::Equals, &["b"]),
            ("a==b", Operator::DoubleEquals, &["b"]),
            ("a!=b", Operator::NotEquals, &["b"]),
            ("a in (b,c)", Operator::In, &["b", "c"]),
            ("a notin (c,b)", Operator::NotIn, &["b", "c"]),
            ("a>1", Operator::GreaterThan, &["1"]),
            ("a<1", Operator::LessThan, &["1"]),
            ("a=", Operator::Equals, &[""]),
            ("a in ()", Operator::In, &[""]),
            ("a in (,b)", Operator::In, &["", "b"]),
            ("a in (b,)", Operator::In, &["", "b"]),
            ("a in (b,,c)", Operator::In, &["", "b", "c"]),
            ("a in (b,b)", Operator::In, &["b"]),
            ("a in (in,notin)", Operator::In, &["in", "notin"]),
            ("a = in", Operator::Equals, &["in"]),
        ];
        for (input, op, values) in cases {
            let s = sel(input);
            assert_eq!(s.requirements().len(), 1, "{input}");
            let r = &s.requirements()[0];
            assert_eq!(r.key(), "a", "{input}");
            assert_eq!(r.operator(), *op, "{input}");
            assert_eq!(r.values(), *values, "{input}");
        }
        // keywords are fine as keys
        assert_eq!(sel("in in (in)").requirements()[0].key(), "in");
        assert_eq!(sel("notin").requirements()[0].operator(), Operator::Exists);
    }

    #[test]
    fn whitespace() {
        let s = sel("  a  =  b ,\tc\nin ( x , y ) , ! d , e != f ");
        assert_eq!(s.to_string(), "a=b,c in (x,y),!d,e!=f");
        assert_eq!(sel("a in(x)").to_string(), "a in (x)");
        assert_eq!(sel("a notin(x)").to_string(), "a notin (x)");
    }

    #[test]
    fn qualified_keys() {
        let s = sel("example.com/app=web,app.kubernetes.io/name in (a)");
        assert_eq!(
            s.to_string(),
            "app.kubernetes.io/name in (a),example.com/app=web"
        );
    }

    #[test]
    fn display_round_trip() {
        for input in [
            "a=b",
            "a==b",
            "a!=b",
            "a",
            "!a",
            "a in (b,c)",
            "a notin (b,c)",
            "a>5",
            "a<5",
            "a=",
            "a in (,b)",
            "a notin ()",
            "a,b=c,d in (e),!f",
        ] {
            let s = sel(input);
            let printed = s.to_string();
            assert_eq!(sel(&printed), s, "{input}");
            assert_eq!(sel(&printed).to_string(), printed, "{input}");
        }
        // canonical: sorted by key, values sorted
        assert_eq!(sel("z=1,a in (c,b),m").to_string(), "a in (b,c),m,z=1");
        assert_eq!(sel("a notin ()").to_string(), "a notin ()");
    }

    #[test]
    fn matching() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("n", "5"),
            ("s", "x"),
            ("e", ""),
        ]);
        let yes = [
            "",
            "app",
            "!missing",
            "app=web",
            "app==web",
            "app!=db",
            "missing!=db",
            "app in (web,db)",
            "app notin (db)",
            "missing notin (db)",
            "n>4",
            "n<6",
            "e=",
            "e in ()",
            "app=web,tier=front",
        ];
        for s in yes {
            assert!(sel(s).matches(&l), "{s} should match");
        }
        let no = [
            "missing",
            "!app",
            "app=db",
            "missing=web",
            "missing in (web)",
            "app!=web",
            "app in (db)",
            "app notin (web)",
            "n>5",
            "n<5",
            "missing>1",
            "missing<1",
            "s>1",
            "s<1",
            "app=web,tier=back",
            "e!=",
        ];
        for s in no {
            assert!(!sel(s).matches(&l), "{s} should not match");
        }
        // large and negative label values
        let l = labels(&[("n", "-3")]);
        assert!(sel("n<0").matches(&l));
        let l = labels(&[("n", "99999999999999999999")]);
        assert!(!sel("n>0").matches(&l));
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(err("a=b=c"), "found '=', expected: ',' or 'end of string'");
        assert_eq!(err("a=b c"), "found 'c', expected: ',' or 'end of string'");
        assert_eq!(err("!a=b"), "found '=', expected: ',' or 'end of string'");
        assert_eq!(err("a,"), "found '', expected: identifier after ','");
        assert_eq!(err("a,,b"), "found ',', expected: identifier after ','");
        assert_eq!(
            err("=a"),
            "found '=', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(
            err(",a"),
            "found ',', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(
            err("!"),
            "unable to parse requirement: found '', expected: identifier"
        );
        assert_eq!(
            err("!!a"),
            "unable to parse requirement: found '!', expected: identifier"
        );
        assert_eq!(
            err("a in ("),
            "unable to parse requirement: found '', expected: ',', ')' or identifier"
        );
        assert_eq!(
            err("a in"),
            "unable to parse requirement: found '' expected: '('"
        );
        assert_eq!(
            err("a in b"),
            "unable to parse requirement: found 'b' expected: '('"
        );
        assert_eq!(
            err("a in (b"),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
        assert_eq!(
            err("a in (b c)"),
            "unable to parse requirement: found 'c', expected: ',' or ')'"
        );
        assert_eq!(
            err("a in (b,=)"),
            "unable to parse requirement: found '=', expected: ',', or identifier"
        );
        assert_eq!(
            err("a in (=)"),
            "unable to parse requirement: found '=', expected: ',', ')' or identifier"
        );
        assert_eq!(
            err("a=("),
            "unable to parse requirement: found '(', expected: identifier"
        );
        assert_eq!(
            err("a b"),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(
            err("a (b)"),
            "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"
        );
        // ">=" is not an operator: '>' then '='
        assert_eq!(
            err("a>=1"),
            "unable to parse requirement: found '=', expected: identifier"
        );
    }

    #[test]
    fn invalid_keys_and_values() {
        assert_eq!(
            err("a$b=c"),
            format!("unable to parse requirement: <nil>: Invalid value: \"a$b\": {KEY_MSG}")
        );
        assert_eq!(
            err("!-a"),
            format!("unable to parse requirement: <nil>: Invalid value: \"-a\": {KEY_MSG}")
        );
        assert_eq!(
            err("a/b/c"),
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        );
        assert_eq!(
            err(&format!("{}=a", "k".repeat(64))),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"{}\": name part must be no more than 63 characters",
                "k".repeat(64)
            )
        );
        assert_eq!(
            err("app=a$b"),
            format!(
                "unable to parse requirement: values[0][app]: Invalid value: \"a$b\": {VALUE_MSG}"
            )
        );
        assert_eq!(
            err("app in (ok,-x,y-)"),
            format!(
                "unable to parse requirement: [values[0][app]: Invalid value: \"-x\": {VALUE_MSG}, values[2][app]: Invalid value: \"y-\": {VALUE_MSG}]"
            )
        );
        assert_eq!(
            err(&format!("app={}", "v".repeat(64))),
            format!(
                "unable to parse requirement: values[0][app]: Invalid value: \"{}\": must be no more than 63 characters",
                "v".repeat(64)
            )
        );
        assert_eq!(
            err("a>b"),
            "unable to parse requirement: values[0]: Invalid value: \"b\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert_eq!(
            err("a<"),
            "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert!(err("a>-1").contains("values[0][a]: Invalid value: \"-1\""));
        assert!(matches!(
            LabelSelector::parse("a=("),
            Err(SelectorError::UnparsableRequirement(_))
        ));
        assert!(matches!(
            LabelSelector::parse("a,"),
            Err(SelectorError::LabelSyntax(_))
        ));
    }

    #[test]
    fn nul_ends_input_like_upstream() {
        // a NUL between tokens ends the input; inside a word it ends the word
        assert_eq!(sel("a \0,b").to_string(), "a");
        assert_eq!(sel("b\0,a").to_string(), "a,b");
    }

    #[test]
    fn exact_match() {
        let s = sel("a=1,b in (2),c in (3,4),d!=5,e==6");
        assert_eq!(s.requires_exact_match("a"), Some("1"));
        assert_eq!(s.requires_exact_match("b"), Some("2"));
        assert_eq!(s.requires_exact_match("c"), None);
        assert_eq!(s.requires_exact_match("d"), None);
        assert_eq!(s.requires_exact_match("e"), Some("6"));
        assert_eq!(s.requires_exact_match("z"), None);
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_string(),
            operator: op.to_string(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn api(
        match_labels: &[(&str, &str)],
        exprs: Vec<LabelSelectorRequirement>,
    ) -> metav1::LabelSelector {
        metav1::LabelSelector {
            match_labels: if match_labels.is_empty() {
                None
            } else {
                Some(labels(match_labels))
            },
            match_expressions: if exprs.is_empty() { None } else { Some(exprs) },
        }
    }

    #[test]
    fn from_api_operators() {
        let s = LabelSelector::from_api(&api(
            &[("app", "web")],
            vec![
                expr("tier", "In", Some(&["front", "back"])),
                expr("env", "NotIn", Some(&["prod"])),
                expr("team", "Exists", None),
                expr("legacy", "DoesNotExist", Some(&[])),
            ],
        ))
        .unwrap();
        assert_eq!(
            s.to_string(),
            "app=web,env notin (prod),!legacy,team,tier in (back,front)"
        );
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "front"), ("team", "x")])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("team", "x"),
            ("legacy", "")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("team", "x"),
            ("env", "prod")
        ])));
        assert_eq!(sel(&s.to_string()).to_string(), s.to_string());

        let empty = LabelSelector::from_api(&metav1::LabelSelector::default()).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn from_api_errors() {
        let e =
            LabelSelector::from_api(&api(&[], vec![expr("a", "Gt", Some(&["1"]))])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"Gt\" is not a valid label selector operator"
        );
        assert!(matches!(e, SelectorError::InvalidOperator(_)));

        let e = LabelSelector::from_api(&api(&[], vec![expr("a", "In", None)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty"
        );
        let e = LabelSelector::from_api(&api(&[], vec![expr("a", "Exists", Some(&["x"]))]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "values: Invalid value: [\"x\"]: values set must be empty for exists and does not exist"
        );
        let e = LabelSelector::from_api(&api(&[("bad key", "v")], vec![])).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("key: Invalid value: \"bad key\": {KEY_MSG}")
        );
        let e = LabelSelector::from_api(&api(&[("k", "bad value")], vec![])).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("values[0][k]: Invalid value: \"bad value\": {VALUE_MSG}")
        );
        let e = LabelSelector::from_api(&api(&[], vec![expr("-k", "In", None)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("[key: Invalid value: \"-k\": {KEY_MSG}, values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty]")
        );
        assert!(matches!(e, SelectorError::InvalidRequirement(_)));
    }

    #[test]
    fn requirement_new() {
        let r = Requirement::new("a", Operator::Equals, vec!["x".into()]).unwrap();
        assert_eq!(r.to_string(), "a=x");
        let e = Requirement::new("a", Operator::Equals, vec![]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "values: Invalid value: []: exact-match compatibility requires one single value"
        );
        let e =
            Requirement::new("a", Operator::GreaterThan, vec!["1".into(), "2".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "values: Invalid value: [\"1\",\"2\"]: for 'Gt', 'Lt' operators, exactly one value is required"
        );
    }

    // ---- field selectors ----

    fn fsel(s: &str) -> FieldSelector {
        FieldSelector::parse(s).unwrap()
    }

    fn getter<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |f| {
            pairs
                .iter()
                .find(|(k, _)| *k == f)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn field_basic() {
        let s = fsel("");
        assert!(s.is_empty());
        assert!(s.matches(getter(&[])));
        assert!(FieldSelector::everything().is_empty());

        let s = fsel("metadata.name=foo");
        assert!(!s.is_empty());
        assert_eq!(s.fields().collect::<Vec<_>>(), vec!["metadata.name"]);
        assert_eq!(s.exact_value("metadata.name"), Some("foo"));
        assert_eq!(s.exact_value("metadata.namespace"), None);
        assert!(s.matches(getter(&[("metadata.name", "foo")])));
        assert!(!s.matches(getter(&[("metadata.name", "bar")])));
        assert!(!s.matches(getter(&[])));

        let s = fsel("metadata.name==foo");
        assert_eq!(s.exact_value("metadata.name"), Some("foo"));
        assert_eq!(s.to_string(), "metadata.name=foo");
    }

    #[test]
    fn field_not_equals_and_missing() {
        let s = fsel("spec.nodeName!=");
        assert_eq!(s.exact_value("spec.nodeName"), None);
        assert!(!s.matches(getter(&[])), "missing field reads as empty");
        assert!(s.matches(getter(&[("spec.nodeName", "n1")])));
        let s = fsel("spec.nodeName=");
        assert!(s.matches(getter(&[])));
        let s = fsel("status.phase!=Running");
        assert!(s.matches(getter(&[])));
        assert!(!s.matches(getter(&[("status.phase", "Running")])));
    }

    #[test]
    fn field_multiple_terms() {
        let s = fsel("metadata.namespace=default,status.phase!=Failed,,metadata.name=a");
        assert_eq!(
            s.fields().collect::<Vec<_>>(),
            vec!["metadata.name", "metadata.namespace", "status.phase"]
        );
        assert_eq!(
            s.to_string(),
            "metadata.name=a,metadata.namespace=default,status.phase!=Failed"
        );
        let obj = [
            ("metadata.name", "a"),
            ("metadata.namespace", "default"),
            ("status.phase", "Running"),
        ];
        assert!(s.matches(getter(&obj)));
        let obj = [
            ("metadata.name", "a"),
            ("metadata.namespace", "default"),
            ("status.phase", "Failed"),
        ];
        assert!(!s.matches(getter(&obj)));
        assert_eq!(fsel("a=1,a=2").exact_value("a"), Some("1"));
        assert_eq!(fsel("a!=1,a=2").exact_value("a"), Some("2"));
    }

    #[test]
    fn field_escapes() {
        let s = fsel(r"metadata.name=a\,b\=c\\d,x=y");
        assert_eq!(s.exact_value("metadata.name"), Some(r"a,b=c\d"));
        assert_eq!(s.exact_value("x"), Some("y"));
        assert_eq!(s.to_string(), r"metadata.name=a\,b\=c\\d,x=y");
        assert_eq!(fsel(&s.to_string()), s);
        assert_eq!(escape_field_value(r"a,b=c\"), r"a\,b\=c\\");
        // "a==b" splits at "==", "a=b=c" leaves an unescaped '='
        assert_eq!(fsel("a==b").exact_value("a"), Some("b"));
        assert_eq!(fsel(r"a=b\=c").exact_value("a"), Some("b=c"));
        // "a!==b" splits at "!=", leaving an unescaped '=' in the value
        assert_eq!(
            FieldSelector::parse("a!==b").unwrap_err(),
            SelectorError::UnescapedCharacter('=')
        );
    }

    #[test]
    fn field_errors() {
        let e = FieldSelector::parse("foo").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid selector: 'foo'; can't understand 'foo'"
        );
        let e = FieldSelector::parse("b=1,foo").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid selector: 'b=1,foo'; can't understand 'foo'"
        );
        let e = FieldSelector::parse("a=b=c").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid field selector: unescaped character in value: 61"
        );
        assert_eq!(e, SelectorError::UnescapedCharacter('='));
        let e = FieldSelector::parse(r"a=b\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            r"invalid field selector: invalid escape sequence: \n"
        );
        let e = FieldSelector::parse(r"a=b\").unwrap_err();
        assert_eq!(
            e.to_string(),
            r"invalid field selector: invalid escape sequence: \"
        );
        // an escaped comma does not split, but the term is still checked
        let e = FieldSelector::parse(r"a\,b").unwrap_err();
        assert_eq!(
            e.to_string(),
            r"invalid selector: 'a\,b'; can't understand 'a\,b'"
        );
    }

    #[test]
    fn field_no_trimming() {
        let s = fsel("metadata.name = foo");
        assert_eq!(s.fields().collect::<Vec<_>>(), vec!["metadata.name "]);
        assert_eq!(s.exact_value("metadata.name "), Some(" foo"));
    }
}
