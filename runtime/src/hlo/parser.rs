//! Recursive-descent parser for HLO text.
//!
//! Whitespace (including newlines) and `/* ... */` comments separate tokens anywhere;
//! the grammar never depends on line breaks. Every failure is a [`ParseError`] with the
//! position, never a panic, whatever the input.

use std::collections::HashSet;

use super::{Attribute, Computation, HloModule, Instruction, ParseError, Payload, Shape};

/// Parses the text of one `HloModule`.
pub(crate) fn parse_module(text: &str) -> Result<HloModule, ParseError> {
    let line_starts =
        std::iter::once(0).chain(text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i + 1)).collect();
    let mut p = Parser { src: text.as_bytes(), pos: 0, line_starts };
    let mut computation_names = HashSet::new();
    p.skip_trivia();
    if text[p.pos..].starts_with("module") {
        return Err(p.error(
            "this is StableHLO (MLIR) text, not HLO text: export it with `.as_text(dialect=\"hlo\")` (JAX) or `torch_xla._XLAC._get_xla_tensors_hlo` (PyTorch/XLA)",
        ));
    }
    p.expect_keyword("HloModule")?;
    let name = p.name()?;
    // Module attributes: only Shardy's mesh (`frontend_attributes`) is read, later.
    let mut attributes = Vec::new();
    while p.eat(b',') {
        attributes.push(p.attribute()?);
    }
    let mut computations = Vec::new();
    let mut entry = None;
    loop {
        p.skip_trivia();
        if p.at_end() {
            break;
        }
        if p.metadata_section()? {
            continue;
        }
        let is_entry = p.eat_keyword("ENTRY");
        if is_entry && entry.is_some() {
            return Err(p.error("a second ENTRY computation; a module has exactly one"));
        }
        let computation = p.computation()?;
        if !computation_names.insert(computation.name.clone()) {
            return Err(p.error_at(
                computation.line,
                1,
                format!("computation `{}` is defined twice", computation.name),
            ));
        }
        if is_entry {
            entry = Some(computations.len());
        }
        computations.push(computation);
    }
    let entry = match entry {
        Some(e) => e,
        None => return Err(p.error("the module has no ENTRY computation")),
    };
    Ok(HloModule { name, attributes, computations, entry })
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    /// Byte offset where each line starts, for positions in messages.
    line_starts: Vec<usize>,
}

/// The sections of stack-frame metadata a module may carry between its computations.
const METADATA_SECTIONS: [&str; 4] = ["FileNames", "FunctionNames", "FileLocations", "StackFrames"];

/// How deeply tuple shapes may nest.
const MAX_SHAPE_DEPTH: usize = 64;

impl Parser<'_> {
    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn rest(&self) -> &[u8] {
        &self.src[self.pos.min(self.src.len())..]
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn line_col(&self, pos: usize) -> (usize, usize) {
        let pos = pos.min(self.src.len());
        let line = self.line_starts.partition_point(|&start| start <= pos);
        let column = pos - self.line_starts.get(line.wrapping_sub(1)).copied().unwrap_or(0) + 1;
        (line, column)
    }

    fn line(&self) -> usize {
        self.line_col(self.pos).0
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        let (line, column) = self.line_col(self.pos);
        ParseError { line, column, message: message.into() }
    }

    fn error_at(&self, line: usize, column: usize, message: impl Into<String>) -> ParseError {
        ParseError { line, column, message: message.into() }
    }

    /// Skips whitespace, `/* */` block comments and `//` line comments.
    fn skip_trivia(&mut self) {
        loop {
            while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
                self.pos += 1;
            }
            if self.rest().starts_with(b"/*") {
                match find(&self.src[self.pos + 2..], b"*/") {
                    Some(end) => self.pos += 2 + end + 2,
                    None => self.pos = self.src.len(),
                }
            } else if self.rest().starts_with(b"//") {
                while self.peek().is_some_and(|b| b != b'\n') {
                    self.pos += 1;
                }
            } else {
                return;
            }
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.skip_trivia();
        if self.peek() == Some(byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), ParseError> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{}` {what}, found {}", byte as char, self.found())))
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the text".into(),
            Some(_) => {
                let rest = self.rest();
                let end = rest.iter().position(|b| b.is_ascii_whitespace()).unwrap_or(rest.len()).clamp(1, 24);
                format!("`{}`", String::from_utf8_lossy(&rest[..end]))
            }
        }
    }

    fn word_at_cursor(&self) -> &[u8] {
        let rest = self.rest();
        let end = rest.iter().position(|&b| !is_name_byte(b)).unwrap_or(rest.len());
        &rest[..end]
    }

    fn eat_keyword(&mut self, keyword: &str) -> bool {
        self.skip_trivia();
        if self.word_at_cursor() == keyword.as_bytes() {
            self.pos += keyword.len();
            true
        } else {
            false
        }
    }

    fn expect_keyword(&mut self, keyword: &str) -> Result<(), ParseError> {
        if self.eat_keyword(keyword) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{keyword}`, found {}", self.found())))
        }
    }

    /// An identifier, with an optional leading `%` dropped.
    fn name(&mut self) -> Result<String, ParseError> {
        self.skip_trivia();
        if self.peek() == Some(b'%') {
            self.pos += 1;
        }
        let word = self.word_at_cursor();
        if word.is_empty() {
            return Err(self.error(format!("expected a name, found {}", self.found())));
        }
        let name = String::from_utf8_lossy(word).into_owned();
        self.pos += word.len();
        Ok(name)
    }

    fn unsigned(&mut self) -> Result<u64, ParseError> {
        self.skip_trivia();
        let rest = self.rest();
        let len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let text = std::str::from_utf8(&rest[..len]).unwrap_or("");
        let value = text
            .parse::<u64>()
            .map_err(|_| self.error(format!("expected a non-negative integer, found {}", self.found())))?;
        self.pos += len;
        Ok(value)
    }

    /// Skips a section of the stack-frame metadata XLA prints with a module (dumps, and
    /// modules printed with metadata): a [`METADATA_SECTIONS`] keyword,
    /// then numbered entries, each a quoted name or a `{…}` group. Returns whether
    /// there was one; a computation that happens to have a section's name is left to
    /// the caller (it is followed by its signature or body, not by an entry).
    fn metadata_section(&mut self) -> Result<bool, ParseError> {
        self.skip_trivia();
        let start = self.pos;
        let word = self.word_at_cursor();
        let Some(section) = METADATA_SECTIONS.iter().find(|s| s.as_bytes() == word) else {
            return Ok(false);
        };
        self.pos += word.len();
        self.skip_trivia();
        let entry_or_end = self.at_end()
            || self.peek().is_some_and(|b| b.is_ascii_digit())
            || METADATA_SECTIONS.iter().any(|s| s.as_bytes() == self.word_at_cursor());
        if !entry_or_end {
            self.pos = start;
            return Ok(false);
        }
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.unsigned()?;
            self.skip_trivia();
            match self.peek() {
                Some(b'"') => self.quoted()?,
                Some(b'{') => self.balanced()?,
                _ => {
                    return Err(self.error(format!(
                        "expected a quoted name or `{{…}}` after the entry number in the {section} section, found {}",
                        self.found()
                    )));
                }
            }
            self.skip_trivia();
        }
        Ok(true)
    }

    /// `name (params) -> shape { instructions }`; the signature is optional.
    fn computation(&mut self) -> Result<Computation, ParseError> {
        self.skip_trivia();
        let line = self.line();
        let name = self.name()?;
        if self.eat(b'(') {
            if !self.eat(b')') {
                loop {
                    self.name()?;
                    self.expect(b':', "after a parameter name in a computation signature")?;
                    self.shape()?;
                    if self.eat(b')') {
                        break;
                    }
                    self.expect(b',', "between computation parameters")?;
                }
            }
            self.skip_trivia();
            if self.rest().starts_with(b"->") {
                self.pos += 2;
                self.shape()?;
            }
        }
        self.expect(b'{', &format!("to open the body of computation `{name}`"))?;
        let mut instructions: Vec<Instruction> = Vec::new();
        let mut names = HashSet::new();
        let mut root = None;
        loop {
            if self.eat(b'}') {
                break;
            }
            if self.at_end() {
                return Err(self.error(format!("computation `{name}` is not closed with `}}`")));
            }
            let is_root = self.eat_keyword("ROOT");
            let instruction = self.instruction()?;
            if !names.insert(instruction.name.clone()) {
                return Err(self.error_at(
                    instruction.line,
                    1,
                    format!("`{}` is defined twice in computation `{name}`", instruction.name),
                ));
            }
            if is_root {
                if root.is_some() {
                    return Err(self.error_at(
                        instruction.line,
                        1,
                        format!("computation `{name}` has more than one ROOT"),
                    ));
                }
                root = Some(instructions.len());
            }
            instructions.push(instruction);
        }
        if instructions.is_empty() {
            return Err(self.error_at(line, 1, format!("computation `{name}` has no instructions")));
        }
        let root = root.unwrap_or(instructions.len() - 1);
        Ok(Computation { name, instructions, root, line })
    }

    fn instruction(&mut self) -> Result<Instruction, ParseError> {
        self.skip_trivia();
        let line = self.line();
        let name = self.name()?;
        self.expect(b'=', &format!("after instruction name `{name}`"))?;
        let shape = self.shape()?;
        let opcode = self.name()?;
        self.expect(b'(', &format!("after opcode `{opcode}`"))?;
        let mut operands = Vec::new();
        let mut payload = None;
        match opcode.as_str() {
            "parameter" => {
                payload = Some(Payload::ParameterNumber(self.unsigned()?));
                self.expect(b')', "after the parameter number")?;
            }
            "constant" => {
                payload = Some(Payload::Literal(self.literal()?));
            }
            _ => {
                if !self.eat(b')') {
                    loop {
                        operands.push(self.operand()?);
                        if self.eat(b')') {
                            break;
                        }
                        self.expect(b',', "between operands")?;
                    }
                }
            }
        }
        let mut attributes = Vec::new();
        while self.eat(b',') {
            attributes.push(self.attribute()?);
        }
        Ok(Instruction { name, shape, opcode, operands, payload, attributes, line })
    }

    /// An operand reference, optionally preceded by its shape: `f32[2]{0} %x` or `x`.
    fn operand(&mut self) -> Result<String, ParseError> {
        self.skip_trivia();
        let starts_shape = self.peek() == Some(b'(') || {
            let word_len = self.word_at_cursor().len();
            word_len > 0 && self.src.get(self.pos + word_len) == Some(&b'[')
        };
        if starts_shape {
            self.shape()?;
        }
        self.name()
    }

    /// `f32[2,3]{1,0}`, `f32[]`, or a tuple `(f32[], s32[4]{0})`.
    fn shape(&mut self) -> Result<Shape, ParseError> {
        self.nested_shape(0)
    }

    fn nested_shape(&mut self, depth: usize) -> Result<Shape, ParseError> {
        if depth > MAX_SHAPE_DEPTH {
            return Err(self.error(format!("tuple shapes nest deeper than {MAX_SHAPE_DEPTH} levels")));
        }
        self.skip_trivia();
        if self.eat(b'(') {
            let mut parts = Vec::new();
            if !self.eat(b')') {
                loop {
                    parts.push(self.nested_shape(depth + 1)?);
                    if self.eat(b')') {
                        break;
                    }
                    self.expect(b',', "between tuple element shapes")?;
                }
            }
            return Ok(Shape::Tuple(parts));
        }
        let word = self.word_at_cursor();
        if word.is_empty() {
            return Err(self.error(format!("expected a shape such as `f32[2,3]`, found {}", self.found())));
        }
        let element_type = String::from_utf8_lossy(word).into_owned();
        if matches!(element_type.as_str(), "c64" | "c128") {
            return Err(self.error(format!(
                "complex numbers (`{element_type}`) are not supported: virtual NeuronCores compute pred, integers, \
                 f16, bf16 and f32 (the AWS Neuron compiler does not take complex types either)"
            )));
        }
        self.pos += word.len();
        if self.peek() != Some(b'[') {
            return Err(self.error(format!(
                "expected `[` after element type `{element_type}` in a shape, found {}",
                self.found()
            )));
        }
        self.pos += 1;
        let mut dims = Vec::new();
        if !self.eat(b']') {
            loop {
                self.skip_trivia();
                if self.rest().starts_with(b"<=") || self.peek() == Some(b'?') {
                    return Err(
                        self.error("dynamic dimensions (`<=N`, `?`) are not supported; export with static shapes")
                    );
                }
                dims.push(self.unsigned()?);
                if self.eat(b']') {
                    break;
                }
                self.expect(b',', "between dimensions")?;
            }
        }
        // A layout such as `{1,0}` or `{1,0:T(8,128)}`: parsed and dropped.
        if self.peek() == Some(b'{') {
            self.balanced()?;
        }
        Ok(Shape::Array { element_type, dims })
    }

    /// The literal of `constant(...)`, through its closing parenthesis, flattened to tokens.
    fn literal(&mut self) -> Result<Vec<String>, ParseError> {
        let mut tokens = Vec::new();
        let mut depth = 0usize;
        loop {
            self.skip_trivia();
            match self.peek() {
                None => return Err(self.error("constant literal is not closed with `)`")),
                Some(b'{') => {
                    depth += 1;
                    self.pos += 1;
                }
                Some(b'}') => {
                    depth = depth.checked_sub(1).ok_or_else(|| self.error("unbalanced `}` in constant literal"))?;
                    self.pos += 1;
                }
                Some(b',') => self.pos += 1,
                Some(b')') if depth == 0 => {
                    self.pos += 1;
                    return Ok(tokens);
                }
                Some(b'.') if self.rest().starts_with(b"...") => {
                    return Err(self.error(
                        "constant literal is elided (`{...}`); re-export the HLO with large constants printed",
                    ));
                }
                Some(_) => {
                    let rest = self.rest();
                    let len = rest
                        .iter()
                        .position(|&b| b.is_ascii_whitespace() || matches!(b, b',' | b'{' | b'}' | b')'))
                        .unwrap_or(rest.len());
                    if len == 0 {
                        return Err(self.error(format!("unexpected {} in constant literal", self.found())));
                    }
                    tokens.push(String::from_utf8_lossy(&rest[..len]).into_owned());
                    self.pos += len;
                }
            }
        }
    }

    /// `name=value`, where the value runs to the next top-level `,` or the end of the
    /// instruction, with brackets and quotes balanced.
    fn attribute(&mut self) -> Result<Attribute, ParseError> {
        let name = self.name()?;
        self.expect(b'=', &format!("after attribute `{name}`"))?;
        self.skip_trivia();
        let start = self.pos;
        match self.peek() {
            Some(b'{') => self.balanced()?,
            Some(b'"') => self.quoted()?,
            _ => {
                while let Some(b) = self.peek() {
                    if b.is_ascii_whitespace() || matches!(b, b',' | b'}' | b')') {
                        break;
                    }
                    if matches!(b, b'{' | b'[' | b'(') {
                        self.balanced()?;
                    } else {
                        self.pos += 1;
                    }
                }
            }
        }
        if self.pos == start {
            return Err(self.error(format!("attribute `{name}` has no value")));
        }
        let value = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
        Ok(Attribute { name, value })
    }

    /// Skips a bracketed group starting at the cursor, honouring nesting and quotes.
    fn balanced(&mut self) -> Result<(), ParseError> {
        let open_pos = self.pos;
        let mut stack: Vec<u8> = Vec::new();
        while let Some(b) = self.peek() {
            match b {
                b'{' | b'[' | b'(' => {
                    stack.push(match b {
                        b'{' => b'}',
                        b'[' => b']',
                        _ => b')',
                    });
                    self.pos += 1;
                }
                b'}' | b']' | b')' => {
                    if stack.pop() != Some(b) {
                        return Err(self.error(format!("mismatched `{}`", b as char)));
                    }
                    self.pos += 1;
                    if stack.is_empty() {
                        return Ok(());
                    }
                }
                b'"' => self.quoted()?,
                _ => self.pos += 1,
            }
        }
        let (line, column) = self.line_col(open_pos);
        Err(self.error_at(line, column, "bracket opened here is never closed"))
    }

    fn quoted(&mut self) -> Result<(), ParseError> {
        let open_pos = self.pos;
        self.pos += 1;
        while let Some(b) = self.peek() {
            self.pos += 1;
            match b {
                b'\\' => self.pos = (self.pos + 1).min(self.src.len()),
                b'"' => return Ok(()),
                _ => {}
            }
        }
        let (line, column) = self.line_col(open_pos);
        Err(self.error_at(line, column, "string opened here is never closed"))
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAX_STYLE: &str = r#"HloModule jit_f, entry_computation_layout={(f32[4,5]{1,0})->(f32[4]{0}, f32[])}

region_0.1 {
  a.3 = f32[] parameter(0)
  b.4 = f32[] parameter(1)
  ROOT add.5 = f32[] add(a.3, b.4)
}

ENTRY main.6 {
  x.1 = f32[4,5]{1,0} parameter(0)
  constant.7 = f32[] constant(-inf)
  c.2 = f32[2,2]{1,0} constant({ { 1, 2.5 }, { nan, inf } })
  r.7 = f32[4]{0} reduce(x.1, constant.7), dimensions={1}, to_apply=region_0.1
  s.8 = f32[2,3]{1,0} slice(x.1), slice={[0:4:2], [1:4]}, metadata={op_name="jit(f)/slice" source_file="/a, b.py" source_line=3}
  ROOT tuple.1 = (f32[4]{0}, f32[]) tuple(r.7, /*index=1*/constant.7)
}
"#;

    const XLA_STYLE: &str = r#"HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %x, f32[] %y)
}

ENTRY %main (p: f32[2]) -> f32[] {
  %p = f32[2]{0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %r = f32[] reduce(f32[2]{0} %p, f32[] %zero), dimensions={0}, to_apply=%add
}
"#;

    #[test]
    fn parses_jax_output_with_regions_literals_and_attributes() {
        let m = parse_module(JAX_STYLE).expect("valid");
        assert_eq!(m.name, "jit_f");
        assert_eq!(m.entry().name, "main.6");
        let entry = m.entry();
        assert_eq!(entry.instructions[entry.root].opcode, "tuple");
        assert_eq!(entry.instructions[entry.root].operands, vec!["r.7", "constant.7"]);
        let c = &entry.instructions[2];
        assert_eq!(c.payload, Some(Payload::Literal(vec!["1".into(), "2.5".into(), "nan".into(), "inf".into()])));
        let s = &entry.instructions[4];
        assert_eq!(s.attribute("slice"), Some("{[0:4:2], [1:4]}"));
        assert!(s.attribute("metadata").is_some_and(|m| m.contains("a, b.py")));
        assert_eq!(entry.instructions[3].attribute("to_apply"), Some("region_0.1"));
        assert_eq!(entry.instructions[0].line, 10);
    }

    #[test]
    fn parses_xla_style_with_percent_names_and_typed_operands() {
        let m = parse_module(XLA_STYLE).expect("valid");
        let entry = m.entry();
        assert_eq!(entry.instructions[2].operands, vec!["p", "zero"]);
        assert_eq!(entry.instructions[2].attribute("to_apply"), Some("%add"));
        assert_eq!(m.computations[0].name, "add");
    }

    #[test]
    fn complex_numbers_are_named_not_a_syntax_error() {
        // What `jax.jit(lambda x: x * (1 + 2j))` exports.
        let hlo = "HloModule jit_f\nENTRY main {\n  x = f32[2]{0} parameter(0)\n  \
                   c = c64[] constant((1, 2))\n  ROOT y = c64[2]{0} broadcast(c), dimensions={}\n}\n";
        let err = parse_module(hlo).expect_err("complex");
        assert!(err.message.contains("complex numbers (`c64`) are not supported"), "{err:?}");
    }

    #[test]
    fn stack_frame_sections_after_the_computations_are_skipped() {
        // As `XLA_FLAGS=--xla_dump_to` and modules printed with metadata have them,
        // before the first computation; after the last is accepted too.
        let sections = "\n\nFileNames\n1 \"/tmp/train.py\"\n2 \"/jax/_src/a \\\"b\\\".py\"\n\nFunctionNames\n1 \"step\"\n\n\
                        FileLocations\n1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=3 end_column=20}\n\n\
                        StackFrames\n1 {file_location_id=1 parent_frame_id=0}\n2 {file_location_id=1 parent_frame_id=1}\n";
        let plain = parse_module(JAX_STYLE).expect("parses");
        let (header, computations) = JAX_STYLE.split_once('\n').expect("a header line");
        for text in [format!("{header}{sections}{computations}"), format!("{JAX_STYLE}{sections}")] {
            let with_sections = parse_module(&text).expect("parses with the sections");
            assert_eq!(with_sections.computations.len(), plain.computations.len());
            assert_eq!(with_sections.entry, plain.entry);
        }
        // Empty sections, and a computation named like a section, are fine too.
        let named = "HloModule m\nFileNames {\n  a = f32[] parameter(0)\n}\n\
                     ENTRY e {\n  b = f32[] parameter(0)\n}\nFileNames\nStackFrames\n";
        let module = parse_module(named).expect("parses");
        assert_eq!(module.computations.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["FileNames", "e"]);
        // A damaged entry names its section.
        let err = parse_module(&format!("{JAX_STYLE}\nStackFrames\n1 file_location_id=1\n")).expect_err("damaged");
        assert!(err.message.contains("StackFrames section"), "{err:?}");
    }

    #[test]
    fn stablehlo_text_gets_a_hint_to_export_hlo_text() {
        let mlir = "module @jit_f attributes {mhlo.num_partitions = 1 : i32} {\n}\n";
        let err = parse_module(mlir).expect_err("MLIR text");
        assert!(err.message.contains("as_text(dialect=\"hlo\")"), "{err:?}");
    }

    #[test]
    fn errors_carry_line_numbers() {
        let text = "HloModule m\n\nENTRY e {\n  a = f32[2 parameter(0)\n}\n";
        let err = parse_module(text).expect_err("bad shape");
        assert_eq!(err.line, 4);
        let err = parse_module("HloModule m\nfoo {\n a = f32[] parameter(0)\n}\n").expect_err("no entry");
        assert!(err.message.contains("no ENTRY"), "{err}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = format!("HloModule m\nENTRY e {{\n a = {} parameter(0)\n}}\n", "(".repeat(100_000));
        let err = parse_module(&text).expect_err("too deep");
        assert!(err.message.contains("nest deeper"), "{err}");
        assert_eq!(err.line, 3);
    }

    #[test]
    fn every_prefix_of_valid_text_is_handled_without_panicking() {
        for text in [JAX_STYLE, XLA_STYLE] {
            for end in 0..text.len() {
                if text.is_char_boundary(end) {
                    let _ = parse_module(&text[..end]);
                }
            }
        }
    }
}
