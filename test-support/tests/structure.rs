//! The workspace's shape, as `ARCHITECTURE.md` states it: no source file over 1,000
//! lines, no import cycle between the modules of a crate, no dependency between
//! workspace crates that the crate table of `ARCHITECTURE.md` does not list, and no
//! declared dependency that no source file of its crate names.
//!
//! Modules are found from each crate root (`lib.rs`, `main.rs`, `src/bin/…`) through
//! its `mod` declarations. Every path a module names (in `use` items and in code,
//! tests left out) that leads into another module of the same crate is an edge. Edges
//! are compared between siblings: two modules under one parent, each standing for
//! everything below it. A parent and its own children may use each other (a module
//! root holds what its children share, and re-exports them); siblings may not depend
//! on each other in a circle, at any level.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The longest a source file may be.
const MAX_LINES: usize = 1000;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root")
}

/// Every `.rs` file under `dir`, outside build output and installed packages.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | "node_modules" | ".git") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 100, "found only {} source files under {}", files.len(), root.display());
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.strip_prefix(&root).unwrap_or(f).display()))
        })
        .collect();
    long.sort();
    assert!(long.is_empty(), "split these along their seams:\n{}", long.join("\n"));
}

/// A module: its path from the crate root (empty for the root).
type Module = Vec<String>;

/// One crate's modules and the paths each names.
#[derive(Debug, Default)]
struct Crate {
    modules: BTreeMap<Module, PathBuf>,
    /// Paths named by each module, made absolute (from the crate root).
    uses: BTreeMap<Module, BTreeSet<Vec<String>>>,
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test")))
    })
}

/// Collects the paths a file names, skipping test-only items and inline modules'
/// insides (which are not files of their own).
struct Names<'a> {
    module: &'a [String],
    /// Child modules declared in this file.
    children: BTreeSet<String>,
    found: BTreeSet<Vec<String>>,
}

impl Names<'_> {
    /// `segments` as named in this module, from the crate root; `None` for paths that
    /// do not start in this crate.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.to_vec(),
            "super" => {
                let mut base = self.module.to_vec();
                base.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                return Some(base);
            }
            child if self.children.contains(child) => {
                let mut base = self.module.to_vec();
                base.push(child.to_owned());
                base
            }
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn add(&mut self, segments: &[String]) {
        if let Some(path) = self.absolute(segments) {
            self.found.insert(path);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                self.add(&path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.add(&path);
            }
            syn::UseTree::Glob(_) => self.add(prefix),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_test_only(&item.attrs) {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.add(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // Test modules, and modules written inline, are not looked into.
        if item.content.is_none() || is_test_only(&item.attrs) {
            return;
        }
        syn::visit::visit_item_mod(self, item);
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }
}

/// The file of module `name` declared in `file` (whose own children live in `dir`).
fn child_file(dir: &Path, item: &syn::ItemMod) -> Option<PathBuf> {
    for attr in &item.attrs {
        if attr.path().is_ident("path")
            && let syn::Meta::NameValue(nv) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value
        {
            return Some(dir.join(s.value()));
        }
    }
    let name = item.ident.to_string();
    [dir.join(format!("{name}.rs")), dir.join(&name).join("mod.rs")].into_iter().find(|p| p.is_file())
}

/// Reads module `module` from `file` and, through its `mod` declarations, every module
/// below it. `dir` is where its child modules' files are.
fn read_module(krate: &mut Crate, module: Module, file: &Path, dir: &Path) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let declared: Vec<&syn::ItemMod> = ast
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if m.content.is_none() && !is_test_only(&m.attrs) => Some(m),
            _ => None,
        })
        .collect();
    let mut names = Names {
        module: &module,
        children: declared.iter().map(|m| m.ident.to_string()).collect(),
        found: BTreeSet::new(),
    };
    names.visit_file(&ast);
    let found = names.found;
    for item in declared {
        let Some(child) = child_file(dir, item) else { continue };
        let mut path = module.clone();
        path.push(item.ident.to_string());
        let child_dir = if child.file_name().is_some_and(|n| n == "mod.rs") {
            child.parent().expect("a directory").to_path_buf()
        } else {
            dir.join(item.ident.to_string())
        };
        read_module(krate, path, &child, &child_dir);
    }
    krate.modules.insert(module.clone(), file.to_path_buf());
    krate.uses.insert(module, found);
}

/// The sibling-level edges of a crate: (parent, from child, to child) → an example of
/// the module and path that makes it.
fn sibling_edges(krate: &Crate) -> BTreeMap<(Module, String, String), String> {
    let mut edges = BTreeMap::new();
    for (from, paths) in &krate.uses {
        for path in paths {
            // The module the path leads into: its longest prefix that is a module.
            let Some(to) = (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| krate.modules.contains_key(p))
            else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // A module and its ancestors or descendants may name each other.
            if common == from.len() || common == to.len() {
                continue;
            }
            let key = (from[..common].to_vec(), from[common].clone(), to[common].clone());
            edges.entry(key).or_insert_with(|| format!("{} names {}", from.join("::"), path.join("::")));
        }
    }
    edges
}

/// The strongly connected components with more than one node (Tarjan).
fn cycles(nodes: &BTreeSet<String>, next: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        next: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        found: Vec<Vec<String>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &str) {
            let i = self.index.len();
            self.index.insert(v.to_owned(), i);
            self.low.insert(v.to_owned(), i);
            self.stack.push(v.to_owned());
            self.on_stack.insert(v.to_owned());
            for w in self.next.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v.to_owned(), low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v.to_owned(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in nodes {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

/// Every crate root of the workspace: `(crate name, root file)`.
fn crate_roots(root: &Path) -> Vec<(String, PathBuf)> {
    let mut roots = Vec::new();
    let mut manifests = Vec::new();
    rust_files(root, &mut Vec::new());
    for entry in std::fs::read_dir(root).expect("the workspace").flatten() {
        let manifest = entry.path().join("Cargo.toml");
        if manifest.is_file() {
            manifests.push(entry.path());
        }
    }
    for dir in manifests {
        let src = dir.join("src");
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for file in ["lib.rs", "main.rs"] {
            if src.join(file).is_file() {
                roots.push((format!("{name} ({file})"), src.join(file)));
            }
        }
        let Ok(bins) = std::fs::read_dir(src.join("bin")) else { continue };
        for bin in bins.flatten() {
            let path = bin.path();
            let main = if path.is_dir() { path.join("main.rs") } else { path.clone() };
            if main.is_file() {
                roots.push((format!("{name} (bin {})", bin.file_name().to_string_lossy()), main));
            }
        }
    }
    roots.sort();
    roots
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let root = workspace_root();
    let roots = crate_roots(&root);
    assert!(roots.len() >= 8, "found only {} crate roots under {}", roots.len(), root.display());
    let mut problems = Vec::new();
    for (name, file) in roots {
        let mut krate = Crate::default();
        let dir = file.parent().expect("a directory").to_path_buf();
        read_module(&mut krate, Vec::new(), &file, &dir);
        let edges = sibling_edges(&krate);
        let mut levels: BTreeMap<Module, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (parent, from, to) in edges.keys() {
            levels.entry(parent.clone()).or_default().entry(from.clone()).or_default().insert(to.clone());
        }
        for (parent, next) in &levels {
            let nodes: BTreeSet<String> = next.iter().flat_map(|(k, v)| v.iter().chain([k])).cloned().collect();
            for cycle in cycles(&nodes, next) {
                let examples: Vec<String> = edges
                    .iter()
                    .filter(|((p, a, b), _)| p == parent && cycle.contains(a) && cycle.contains(b))
                    .map(|((_, a, b), why)| format!("    {a} -> {b}: {why}"))
                    .collect();
                let at = if parent.is_empty() { "the crate root".to_owned() } else { parent.join("::") };
                problems.push(format!("{name}, under {at}: {}\n{}", cycle.join(", "), examples.join("\n")));
            }
        }
    }
    assert!(problems.is_empty(), "modules that import each other in a circle:\n{}", problems.join("\n"));
}

/// A workspace member: its package name, folder, and the names of its normal
/// dependencies (`[dependencies]`: what it links in every build).
struct Member {
    name: String,
    /// The name its sources use it by: `[lib] name`, else the package's.
    lib: String,
    dir: PathBuf,
    dependencies: Vec<String>,
}

/// The members `Cargo.toml` lists, read from their manifests (the few lines of TOML
/// these need: a section header, then `name = …` or `name.workspace = true` lines).
fn members() -> Vec<Member> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let line = manifest.lines().find(|l| l.starts_with("members")).expect("a members list");
    let dirs = line.split('"').skip(1).step_by(2);
    dirs.map(|dir| {
        let dir = root.join(dir);
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).expect("a member manifest");
        let (mut section, mut name, mut lib, mut dependencies) = (String::new(), None, None, Vec::new());
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let key = line.split(['=', '.', ' ']).next().unwrap_or_default().to_string();
            match section.as_str() {
                "[package]" if key == "name" && name.is_none() => {
                    name = line.split('"').nth(1).map(str::to_string);
                }
                "[lib]" if key == "name" => lib = line.split('"').nth(1).map(str::to_string),
                "[dependencies]" => dependencies.push(key),
                _ => {}
            }
        }
        let name = name.expect("a package name");
        Member { lib: lib.unwrap_or_else(|| name.replace('-', "_")), name, dir, dependencies }
    })
    .collect()
}

/// The edges `ARCHITECTURE.md` allows: for each crate of its table's first column, the
/// crates named (in backquotes) in the second.
fn allowed_edges() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let quoted = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    let mut allowed = BTreeMap::new();
    for row in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').collect();
        let (Some(crates), Some(may)) = (cells.get(1), cells.get(2)) else { continue };
        let targets: BTreeSet<String> = quoted(may).into_iter().collect();
        for name in quoted(crates).into_iter().filter(|n| !n.ends_with('/')) {
            allowed.insert(name, targets.clone());
        }
    }
    allowed
}

#[test]
fn every_edge_between_workspace_crates_is_one_architecture_allows() {
    let members = members();
    let allowed = allowed_edges();
    let names: BTreeSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
    let mut wrong = Vec::new();
    for m in &members {
        let Some(may) = allowed.get(&m.name) else {
            wrong.push(format!("{} is not in the crate table of ARCHITECTURE.md", m.name));
            continue;
        };
        for dep in m.dependencies.iter().filter(|d| names.contains(d.as_str())) {
            if !may.contains(dep) {
                wrong.push(format!("{} depends on {dep}, which ARCHITECTURE.md does not allow", m.name));
            }
        }
    }
    assert!(members.len() >= 10 && allowed.len() >= 10, "read {} members, {} table rows", members.len(), allowed.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_declared_dependency_is_used() {
    let mut unused = Vec::new();
    let members = members();
    // A workspace crate is used by its library's name (`neuron-pjrt` as `neuronpjrt`).
    let libs: BTreeMap<&str, &str> = members.iter().map(|m| (m.name.as_str(), m.lib.as_str())).collect();
    for m in &members {
        let mut files = Vec::new();
        rust_files(&m.dir.join("src"), &mut files);
        let source: String = files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect();
        for dep in &m.dependencies {
            let ident = libs.get(dep.as_str()).map_or_else(|| dep.replace('-', "_"), |lib| (*lib).to_owned());
            // As a path or an item name: `serde::`, `use nix`, `#[derive(serde::…)]`.
            let used = source.match_indices(&ident).any(|(at, _)| {
                let before = source[..at].chars().next_back().is_none_or(|c| !c.is_alphanumeric() && c != '_');
                let after = source[at + ident.len()..].chars().next().is_none_or(|c| !c.is_alphanumeric() && c != '_');
                before && after
            });
            if !used {
                unused.push(format!(
                    "{}: {dep} (remove it, or move it to [dev-dependencies] if only tests use it)",
                    m.name
                ));
            }
        }
    }
    assert!(unused.is_empty(), "declared and never used:\n{}", unused.join("\n"));
}
