//! The browser test client itself (`candle_mha_test_support::browser`) on a small page: real mouse
//! events reach the page at the right place, typing, screenshots with the right pixels, and
//! JS errors are caught. The HTML pages' own tests rely on all of these.

use candle_mha_test_support as common;

use std::time::Duration;

use anyhow::Result;
use common::browser::{base64_decode, Browser};

const PAGE: &str = r#"<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body { margin: 0; } #box { position: absolute; left: 100px; top: 50px; width: 200px;
height: 100px; background: #ff0000; } #out { position: absolute; top: 300px; }
</style></head><body>
<div id="box"></div><input id="name"><div id="out"></div>
<script>
const out = document.getElementById('out');
let clicks = 0;
document.getElementById('box').addEventListener('mousemove', e => {
  const r = e.target.getBoundingClientRect();
  out.dataset.move = Math.round(e.clientX - r.left) + ',' + Math.round(e.clientY - r.top);
});
document.getElementById('box').addEventListener('click', () => { out.dataset.clicks = ++clicks; });
document.getElementById('name').addEventListener('input', e => { out.textContent = e.target.value; });
if (location.hash === '#fail') { setTimeout(() => { throw new Error('boom'); }, 0); }
setTimeout(() => { document.body.dataset.ready = '1'; }, 10);
</script></body></html>"#;

#[test]
fn base64_round_trips_known_text() -> Result<()> {
    assert_eq!(base64_decode("aGVsbG8gd29ybGQ=")?, b"hello world");
    assert_eq!(base64_decode("YQ==")?, b"a");
    assert!(base64_decode("a*b").is_err());
    Ok(())
}

#[test]
fn mouse_keyboard_screenshot_and_errors() -> Result<()> {
    let Some(b) = Browser::start()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("client page.html");
    std::fs::write(&path, PAGE)?;
    b.open(&path)?;

    b.hover_at("#box", 30.0, 20.0)?;
    assert_eq!(
        b.eval("return document.getElementById('out').dataset.move")?,
        "30,20"
    );
    b.click("#box")?;
    b.click_at("#box", 5.0, 5.0)?;
    assert_eq!(
        b.eval("return document.getElementById('out').dataset.clicks")?,
        "2"
    );
    assert_eq!(
        b.eval("return document.getElementById('out').dataset.move")?,
        "5,5"
    );
    b.type_into("#name", "a<b> & \"c\"")?;
    assert_eq!(b.text("#out")?, "a<b> & \"c\"");
    assert_eq!(b.count("div")?, 2);

    let shot = dir.path().join("shot.png");
    b.screenshot(&shot)?;
    let img = common::image::Image::open(&shot)?;
    assert_eq!(img.at(150, 100), [255, 0, 0], "inside #box");
    assert_eq!(img.at(50, 100), [255, 255, 255], "left of #box");
    assert!(b.js_errors()?.is_empty());

    // A page that throws: `open` reports it; `js_errors` empties the list.
    let url_path = dir.path().join("fail.html");
    std::fs::write(&url_path, PAGE.replace("location.hash === '#fail'", "true"))?;
    let err = b.open(&url_path).unwrap_err();
    assert!(format!("{err:#}").contains("boom"), "{err:#}");
    assert!(b.js_errors()?.is_empty());
    assert!(b
        .wait_for("false", Duration::from_millis(100))
        .unwrap_err()
        .to_string()
        .contains("timed out"));
    Ok(())
}
