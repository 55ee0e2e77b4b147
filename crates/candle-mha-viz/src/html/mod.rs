//! Interactive pages: one self-contained HTML file per view (inline CSS, JS and data; nothing
//! is fetched from the network, so a page works offline and can be mailed), drawn with the
//! same viridis colour map as the PNG/SVG heatmaps.
//!
//! Token text only ever reaches the page as JSON data that the scripts insert with
//! `textContent`, so a label such as `<script>` shows as text and runs nothing. Numbers are
//! stored at a stated precision (`decimals`, default 4: each value the page shows is within
//! `0.5·10^-decimals` of the input), which keeps the file size proportional to the weights;
//! the summary line of each page states it and the file's size.

mod explorer;
mod page;
mod vocab;
pub use explorer::{attention_explorer, ExplorerOptions};
pub use vocab::{vocab_matrix_html, VocabHtmlOptions};
