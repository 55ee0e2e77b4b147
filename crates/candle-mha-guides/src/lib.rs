//! The README's Rust examples as doctests, built against exactly the crates its
//! `[dependencies]` block lists. The guides' examples live with the crate whose API they
//! show: `docs/checkpoints.md` and `docs/masks-and-differences.md` with `candle-mha`,
//! `docs/reading-attention.md` with `candle-mha-viz`.

#[cfg(doctest)]
#[doc = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/README.md"))]
pub struct Readme;

#[cfg(test)]
mod tests {
    /// The crate names of a `[dependencies]` table's lines (`name = …`, `name.workspace = …`).
    fn dependency_names(toml: &str) -> Vec<String> {
        let table = toml
            .split("[dependencies]\n")
            .nth(1)
            .unwrap_or("")
            .split("\n[")
            .next()
            .unwrap_or("");
        let mut names: Vec<String> = table
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
            .map(|k| k.trim_end_matches(".workspace").to_string())
            .filter(|k| !k.is_empty())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_readme_lists_the_dependencies_its_examples_compile_with() {
        let readme = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/README.md"));
        let block = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the README has a toml block");
        let ours = dependency_names(include_str!("../Cargo.toml"));
        assert_eq!(dependency_names(block), ours);
        assert_eq!(ours, ["candle-mha", "candle-mha-train"]);
    }
}
