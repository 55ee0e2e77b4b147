//! A headless Chromium driven through WebDriver (`chromedriver`), for the tests of the
//! interactive HTML pages: open a page, run JS, move and click the mouse as a user would,
//! type, take screenshots, collect JS errors.
//!
//! The WebDriver wire protocol is plain HTTP + JSON on localhost, spoken here over
//! `std::net::TcpStream` with `serde_json`: no async runtime or browser crate in the build.
//!
//! Binaries are found through `CHROMEDRIVER` / `CHROMIUM` (paths) or on `PATH`
//! (`chromedriver`; `chromium`, `chromium-browser`, `google-chrome`). When they are missing
//! [`Browser::start`] returns `None` and prints `SKIPPED`, unless `MHA_REQUIRE_BROWSER` is set
//! (CI sets it), where it fails.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The W3C name of an element reference in WebDriver JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Records uncaught exceptions, unhandled rejections and `console.error` calls of every page,
/// installed before the page's own scripts run.
const ERROR_RECORDER: &str = r#"
window.__mhaErrors = [];
window.addEventListener('error', e => window.__mhaErrors.push('uncaught: ' + (e.message || e)));
window.addEventListener('unhandledrejection', e => window.__mhaErrors.push('rejection: ' + e.reason));
(() => { const orig = console.error; console.error = function (...a) {
  window.__mhaErrors.push('console.error: ' + a.map(String).join(' ')); return orig.apply(this, a); }; })();
"#;

/// One chromedriver process with one headless Chromium session; both end on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

fn find_program(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `path` as a `file://` URL (absolute; the few characters a URL path cannot hold encoded).
pub fn file_url(path: &Path) -> Result<String> {
    let abs = std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))?;
    let mut url = String::from("file://");
    for c in abs.to_string_lossy().chars() {
        match c {
            ' ' => url.push_str("%20"),
            '%' => url.push_str("%25"),
            '#' => url.push_str("%23"),
            '?' => url.push_str("%3F"),
            c => url.push(c),
        }
    }
    Ok(url)
}

/// Where the HTML tests write their screenshots for people to look at:
/// `target/html-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    super::repo_root().join("target/html-screenshots")
}

/// The JSON of a page's `<script type="application/json" id="mha-data">` element.
pub fn page_data(html: &str) -> Result<Value> {
    let start_tag = r#"<script type="application/json" id="mha-data">"#;
    let start = html.find(start_tag).context("no #mha-data")? + start_tag.len();
    let len = html[start..]
        .find("</script>")
        .context("unclosed #mha-data")?;
    Ok(serde_json::from_str(&html[start..start + len])?)
}

/// Decodes standard base64 (the screenshot encoding).
pub fn base64_decode(s: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            _ => bail!("not base64: byte {c}"),
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// Decodes a `Transfer-Encoding: chunked` body.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("chunked body: no size line")?;
        let size_text = std::str::from_utf8(&body[..line_end])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (window 1400 × 1000). `Ok(None)` when they
    /// are not installed and `MHA_REQUIRE_BROWSER` is unset.
    pub fn start() -> Result<Option<Browser>> {
        let driver = find_program("CHROMEDRIVER", &["chromedriver"]);
        let chromium = find_program(
            "CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome", "chrome"],
        );
        let (driver, chromium) = match (driver, chromium) {
            (Some(d), Some(c)) => (d, c),
            _ => {
                let msg = "chromedriver and chromium not found (set CHROMEDRIVER/CHROMIUM or \
                           install Debian's chromium chromium-driver)";
                if std::env::var_os("MHA_REQUIRE_BROWSER").is_some() {
                    bail!("MHA_REQUIRE_BROWSER is set but {msg}")
                }
                eprintln!("SKIPPED browser test: {msg}");
                return Ok(None);
            }
        };
        let port = free_port()?;
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", driver.display()))?;
        let mut browser = Browser {
            driver: child,
            port,
            session: String::new(),
        };
        let t0 = Instant::now();
        loop {
            if let Ok(v) = browser.request("GET", "/status", None) {
                if v["ready"] == json!(true) {
                    break;
                }
            }
            if t0.elapsed() > Duration::from_secs(20) {
                bail!("{} did not become ready in 20 s", driver.display())
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000",
                         "--allow-file-access-from-files", "--hide-scrollbars",
                         "--force-device-scale-factor=1"]
            }
        }}});
        let v = browser
            .request("POST", "/session", Some(caps))
            .context("creating a Chromium session")?;
        browser.session = v["sessionId"]
            .as_str()
            .context("no sessionId in the new-session reply")?
            .to_string();
        browser.cmd(
            "POST",
            "goog/cdp/execute",
            json!({"cmd": "Page.addScriptToEvaluateOnNewDocument",
                   "params": {"source": ERROR_RECORDER}}),
        )?;
        Ok(Some(browser))
    }

    /// One WebDriver call; returns the reply's `value`, or an error with WebDriver's message.
    fn request(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )?;
        // Read the headers, then exactly the body: chromedriver may keep the connection open.
        let mut reply = Vec::new();
        let mut buf = [0u8; 65536];
        let split = loop {
            if let Some(p) = reply.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            let n = stream.read(&mut buf)?;
            if n == 0 {
                bail!("{method} {path}: connection closed before the reply's headers")
            }
            reply.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&reply[..split]).to_ascii_lowercase();
        let mut raw = reply[split + 4..].to_vec();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse::<usize>())
            .transpose()?;
        let chunked = head.contains("transfer-encoding: chunked");
        loop {
            let done = match length {
                Some(len) => raw.len() >= len,
                None if chunked => raw.windows(5).any(|w| w == b"0\r\n\r\n"),
                None => false,
            };
            if done {
                break;
            }
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        let body = if chunked { dechunk(&raw)? } else { raw };
        let v: Value = serde_json::from_slice(&body).with_context(|| {
            format!(
                "{method} {path}: reply is not JSON: {}",
                String::from_utf8_lossy(&body)
            )
        })?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if let Some(err) = value.get("error").and_then(Value::as_str) {
            let msg = value["message"].as_str().unwrap_or("");
            bail!("WebDriver {method} {path}: {err}: {msg}")
        }
        // The new-session reply keeps sessionId inside value.
        Ok(value)
    }

    fn cmd(&self, method: &str, what: &str, body: Value) -> Result<Value> {
        let path = format!("/session/{}/{what}", self.session);
        let body = (method == "POST").then_some(body);
        self.request(method, &path, body)
    }

    /// Opens a local file and waits until `document.body.dataset.ready == "1"` (20 s), then
    /// fails if the page logged any JS error.
    pub fn open(&self, path: &Path) -> Result<()> {
        self.cmd("POST", "url", json!({"url": file_url(path)?}))?;
        self.wait_for(
            "document.body && document.body.dataset.ready === '1'",
            Duration::from_secs(20),
        )
        .with_context(|| {
            format!(
                "{} never became ready: {:?}",
                path.display(),
                self.js_errors()
            )
        })?;
        let errors = self.js_errors()?;
        if !errors.is_empty() {
            bail!("{} logged JS errors: {errors:?}", path.display())
        }
        Ok(())
    }

    /// Resizes the window (outer size, in CSS pixels), as a user would.
    pub fn set_window_size(&self, width: u32, height: u32) -> Result<()> {
        self.cmd(
            "POST",
            "window/rect",
            json!({"width": width, "height": height}),
        )?;
        Ok(())
    }

    /// Runs `js` as a function body (use `return …`) and returns its JSON value.
    pub fn eval(&self, js: &str) -> Result<Value> {
        self.cmd("POST", "execute/sync", json!({"script": js, "args": []}))
            .with_context(|| format!("evaluating: {js}"))
    }

    /// Polls the JS expression `js_expr` until it is truthy.
    pub fn wait_for(&self, js_expr: &str, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let v = self.eval(&format!("return !!({js_expr});"))?;
            if v == json!(true) {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!("timed out after {timeout:?} waiting for {js_expr}")
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The viewport position of the first match of `css`'s top-left corner, after scrolling it
    /// into view.
    fn corner(&self, css: &str) -> Result<(f64, f64)> {
        let v = self.eval(&format!(
            "const e = document.querySelector({sel}); if (!e) return null;
             e.scrollIntoView({{block: 'nearest', inline: 'nearest'}});
             const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height];",
            sel = json!(css)
        ))?;
        let a = v
            .as_array()
            .with_context(|| format!("no element matches {css}"))?;
        Ok((a[0].as_f64().unwrap(), a[1].as_f64().unwrap()))
    }

    fn size(&self, css: &str) -> Result<(f64, f64)> {
        let v = self.eval(&format!(
            "const r = document.querySelector({}).getBoundingClientRect(); return [r.width, r.height];",
            json!(css)
        ))?;
        Ok((v[0].as_f64().unwrap(), v[1].as_f64().unwrap()))
    }

    fn pointer(&self, x: f64, y: f64, click: bool) -> Result<()> {
        let mut actions = vec![
            json!({"type": "pointerMove", "duration": 0, "origin": "viewport",
                                       "x": x.round() as i64, "y": y.round() as i64}),
        ];
        if click {
            actions.push(json!({"type": "pointerDown", "button": 0}));
            actions.push(json!({"type": "pointerUp", "button": 0}));
        }
        self.cmd(
            "POST",
            "actions",
            json!({"actions": [{"type": "pointer", "id": "mouse",
                                "parameters": {"pointerType": "mouse"}, "actions": actions}]}),
        )?;
        Ok(())
    }

    /// Moves the mouse to `(x, y)` CSS px from the top-left corner of the first match of `css`.
    pub fn hover_at(&self, css: &str, x: f64, y: f64) -> Result<()> {
        let (left, top) = self.corner(css)?;
        self.pointer(left + x, top + y, false)
    }

    /// Clicks at `(x, y)` CSS px from the top-left corner of the first match of `css`.
    pub fn click_at(&self, css: &str, x: f64, y: f64) -> Result<()> {
        let (left, top) = self.corner(css)?;
        self.pointer(left + x, top + y, true)
    }

    /// Moves the mouse to the centre of the first match of `css`.
    pub fn hover(&self, css: &str) -> Result<()> {
        let (w, h) = self.size(css)?;
        self.hover_at(css, w / 2.0, h / 2.0)
    }

    /// Clicks the centre of the first match of `css`.
    pub fn click(&self, css: &str) -> Result<()> {
        let (w, h) = self.size(css)?;
        self.click_at(css, w / 2.0, h / 2.0)
    }

    fn element(&self, css: &str) -> Result<String> {
        let v = self
            .cmd(
                "POST",
                "element",
                json!({"using": "css selector", "value": css}),
            )
            .with_context(|| format!("finding {css}"))?;
        Ok(v[ELEMENT_KEY]
            .as_str()
            .context("no element id")?
            .to_string())
    }

    /// Clears the first match of `css` (an input) and types `text` into it, key by key.
    pub fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let id = self.element(css)?;
        self.cmd("POST", &format!("element/{id}/clear"), json!({}))?;
        self.cmd(
            "POST",
            &format!("element/{id}/value"),
            json!({"text": text}),
        )?;
        Ok(())
    }

    /// The number of elements matching `css`.
    pub fn count(&self, css: &str) -> Result<usize> {
        let v = self.eval(&format!(
            "return document.querySelectorAll({}).length;",
            json!(css)
        ))?;
        Ok(v.as_u64().context("count")? as usize)
    }

    /// The `innerText` of the first match of `css`.
    pub fn text(&self, css: &str) -> Result<String> {
        let v = self.eval(&format!(
            "const e = document.querySelector({}); return e ? e.innerText : null;",
            json!(css)
        ))?;
        Ok(v.as_str()
            .with_context(|| format!("no element matches {css}"))?
            .to_string())
    }

    /// A PNG screenshot of the viewport, written to `path` (parent folders created).
    pub fn screenshot(&self, path: &Path) -> Result<()> {
        let v = self.cmd("GET", "screenshot", Value::Null)?;
        let png = base64_decode(v.as_str().context("screenshot is not a string")?)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// JS errors the page logged since the last call (uncaught exceptions, unhandled
    /// rejections, `console.error`).
    pub fn js_errors(&self) -> Result<Vec<String>> {
        let v =
            self.eval("const e = window.__mhaErrors || []; window.__mhaErrors = []; return e;")?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e.as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.request("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
