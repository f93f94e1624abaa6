//! The rendered book in a real browser. `mdbook build docs` writes the book into a scratch
//! folder; headless Chromium, driven by ChromeDriver over the W3C WebDriver protocol (plain
//! HTTP/1.1 on a `TcpStream`, JSON with serde_json), opens the built files as a student's
//! browser opens them (`file://`), every page that `docs/src/SUMMARY.md` lists, and checks on
//! each that
//! - its title (the `<h1>`) is there,
//! - every picture (`<img>`) has loaded: complete, with a width,
//! - the browser's console logged no error (level SEVERE: a script that threw, a file that did
//!   not load).
//!
//! Then it uses the book's search as a student does (the `s` key, then a term the book defines
//! typed into the search box): results must appear, link to chapters, and the first must open
//! with the term marked. Last, it takes screenshots of a few pages ([`SCREENSHOTS`]: the top of
//! the page and its first picture) into `target/browser-screenshots/`, for a person to look at.
//!
//! Without mdbook, Chromium or ChromeDriver (Debian: `apt-get install chromium chromium-driver`)
//! the test says it skipped, unless NCCL_WORKSHOP_REQUIRE_BROWSER=1 (as `.ci/run` sets), where
//! that is a failure. ChromeDriver and the browser it starts run in a process group of their own,
//! marked: at the end, also when the test fails, the session is closed and whatever is left of
//! them killed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::book::chapters;
use test_support::build::{profile_dir, workspace_root};
use test_support::process::{self, Running, Tag};

/// Set to 1 where the browser check must run: missing tools fail instead of skipping.
const REQUIRE: &str = "NCCL_WORKSHOP_REQUIRE_BROWSER";

/// A term the glossary defines, searched for as a student would.
const SEARCH_TERM: &str = "busbw";

/// The chapters whose screenshots are taken: a grid, the ring's pictures, a plot, a timeline.
const SCREENSHOTS: [&str; 4] = ["01-broadcast.md", "watching.md", "curve.md", "training.md"];

/// The browser window: a laptop's screen.
const WINDOW: (u32, u32) = (1280, 900);

/// How long one WebDriver request may take, and how long a page has to settle (pictures,
/// search results) before the check fails.
const REQUEST_LIMIT: Duration = Duration::from_secs(60);
const SETTLE: Duration = Duration::from_secs(10);

/// The key under which WebDriver names an element (W3C).
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

#[test]
fn the_book_works_in_a_real_browser() {
    let Some(tools) = tools_or_skip() else {
        return;
    };
    let started = Instant::now();
    let scratch = process::scratch("browser");
    let book = scratch.join("book");
    build_book(&tools.mdbook, &book);
    let tag = Tag::new("browser");
    {
        let browser = Browser::start(&tools, &scratch, &tag);
        let pages = chapters();
        screenshots(&browser, &book);
        let mut problems: Vec<String> = pages
            .iter()
            .flat_map(|chapter| page_problems(&browser, &book, chapter))
            .collect();
        problems.extend(search_problems(&browser, &book, &pages));
        assert!(
            problems.is_empty(),
            "the book in Chromium ({} pages of {}):\n{}",
            pages.len(),
            book.display(),
            problems.join("\n")
        );
        eprintln!(
            "{} pages opened in Chromium: every title and picture there, no console error; \
             the search finds {SEARCH_TERM:?}",
            pages.len()
        );
    }
    // The browser is closed and its process group killed: nothing of it may be left.
    tag.assert_all_gone("ChromeDriver and Chromium");
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("browser check: {:.1?}", started.elapsed());
}

/// The programs the check needs.
struct Tools {
    mdbook: PathBuf,
    chromium: PathBuf,
    chromedriver: PathBuf,
}

/// The programs, or None (having said why) where one is missing and the check is not required.
fn tools_or_skip() -> Option<Tools> {
    let find = |names: &[&str]| names.iter().find_map(|name| process::on_path(name));
    let mdbook = find(&["mdbook"]);
    let chromium = find(&["chromium", "chromium-browser", "google-chrome"]);
    let chromedriver = find(&["chromedriver"]);
    let missing: Vec<&str> = [
        (
            mdbook.is_none(),
            "mdbook (cargo install mdbook --locked --version 0.4.52)",
        ),
        (chromium.is_none(), "Chromium (apt-get install chromium)"),
        (
            chromedriver.is_none(),
            "ChromeDriver (apt-get install chromium-driver)",
        ),
    ]
    .into_iter()
    .filter_map(|(absent, what)| absent.then_some(what))
    .collect();
    if !missing.is_empty() {
        let why = format!("not on PATH: {}", missing.join(", "));
        let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
        assert!(!required, "{REQUIRE}=1 but {why}");
        eprintln!("skipped: the book in a browser: {why}");
        return None;
    }
    Some(Tools {
        mdbook: mdbook?,
        chromium: chromium?,
        chromedriver: chromedriver?,
    })
}

/// `mdbook build docs -d OUT`, which must log no error or warning.
fn build_book(mdbook: &Path, out: &Path) {
    let built = process::start(
        Command::new(mdbook)
            .arg("build")
            .arg("docs")
            .arg("-d")
            .arg(out)
            .current_dir(workspace_root()),
    )
    .finish(Duration::from_secs(60));
    built.assert_success("mdbook build docs");
    let log = format!("{}{}", built.stdout, built.stderr);
    assert!(
        !log.contains("[ERROR]") && !log.contains("[WARN]"),
        "mdbook build docs logged errors or warnings:\n{log}"
    );
}

/// A headless Chromium, through the ChromeDriver that started it. Dropping it closes the
/// session, then kills ChromeDriver's process group (the browser is in it).
struct Browser {
    port: u16,
    session: String,
    _driver: Running,
}

impl Browser {
    fn start(tools: &Tools, scratch: &Path, tag: &Tag) -> Browser {
        let port = comm_core::spawn::free_port().unwrap();
        let mut command = Command::new(&tools.chromedriver);
        command.arg(format!("--port={port}"));
        let driver = process::start(tag.mark(&mut command));
        let mut browser = Browser {
            port,
            session: String::new(),
            _driver: driver,
        };
        browser.wait_until_ready();
        let (width, height) = WINDOW;
        let profile = scratch.join("chromium-profile");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": tools.chromium,
                "args": [
                    "--headless=new",
                    // As root (CI) Chromium refuses to start sandboxed.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--hide-scrollbars",
                    "--force-device-scale-factor=1",
                    "--no-first-run",
                    "--no-default-browser-check",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            // The console's messages, all levels, read back after each page.
            "goog:loggingPrefs": {"browser": "ALL"},
            "timeouts": {"pageLoad": 30_000, "script": 10_000},
        }}});
        let created = browser.call("POST", "/session", Some(capabilities));
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {created}"))
            .to_string();
        browser
    }

    /// Polls ChromeDriver's /status until it says it is ready.
    fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match http(self.port, "GET", "/status", None) {
                Ok(status) if status["ready"] == json!(true) => return,
                other => assert!(
                    Instant::now() < deadline,
                    "ChromeDriver on port {} not ready after 30 s: {other:?}",
                    self.port
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A WebDriver request; its `value`, or the test fails with the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        http(self.port, method, path, body.as_ref())
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    /// A request to this browser's session.
    fn session(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Opens `file` and waits for it to load (its pictures included).
    fn open(&self, file: &Path) {
        let url = format!("file://{}", file.display());
        self.session("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body, `return …`) in the page.
    fn script(&self, script: &str) -> Value {
        self.session(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Runs `script` until it returns something other than null or false, for up to [`SETTLE`];
    /// its last value.
    fn script_until(&self, script: &str) -> Value {
        let deadline = Instant::now() + SETTLE;
        loop {
            let value = self.script(script);
            if !(value.is_null() || value == json!(false)) || Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The element `css` selects, or None.
    fn element(&self, css: &str) -> Option<String> {
        let found = http(
            self.port,
            "POST",
            &format!("/session/{}/element", self.session),
            Some(&json!({"using": "css selector", "value": css})),
        )
        .ok()?;
        found[ELEMENT].as_str().map(str::to_string)
    }

    /// Presses and releases `key` on the page, as a person at the keyboard.
    fn press(&self, key: &str) {
        let press = json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
            {"type": "keyDown", "value": key},
            {"type": "keyUp", "value": key},
        ]}]});
        self.session("POST", "/actions", Some(press));
        self.session("DELETE", "/actions", None);
    }

    /// The console's messages since the last call: (level, message).
    fn console(&self) -> Vec<(String, String)> {
        // Not W3C: ChromeDriver's own endpoint (`GET …/se/log` is not served; POST is).
        let log = self.session("POST", "/se/log", Some(json!({"type": "browser"})));
        log.as_array()
            .into_iter()
            .flatten()
            .map(|entry| {
                let text = |key: &str| entry[key].as_str().unwrap_or_default().to_string();
                (text("level"), text("message"))
            })
            .collect()
    }

    /// A PNG of what the window shows.
    fn screenshot(&self) -> Vec<u8> {
        let encoded = self.session("GET", "/screenshot", None);
        let png = base64(encoded.as_str().expect("a base64 string"));
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
        png
    }
}

impl Drop for Browser {
    /// Closes the browser (its processes then exit); dropping `_driver` next kills
    /// ChromeDriver's process group, with whatever of the browser is still in it.
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            );
        }
    }
}

/// One HTTP/1.1 request to ChromeDriver, JSON in and out: the response's `value`, or what went
/// wrong (an HTTP status other than 200 carries the WebDriver error).
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(REQUEST_LIMIT))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let (status, payload) = read_response(&mut stream)?;
    let mut response: Value = serde_json::from_slice(&payload).map_err(|e| {
        format!(
            "HTTP {status}, not JSON ({e}): {}",
            String::from_utf8_lossy(&payload)
        )
    })?;
    let value = response["value"].take();
    if status != 200 {
        return Err(format!(
            "HTTP {status}: {}: {}",
            value["error"].as_str().unwrap_or("?"),
            value["message"].as_str().unwrap_or("?")
        ));
    }
    Ok(value)
}

/// An HTTP response's status and body. ChromeDriver answers `Connection: close` in its headers
/// but keeps the connection open: the body ends where its Content-Length (or its last chunk)
/// says.
fn read_response(stream: &mut TcpStream) -> Result<(u16, Vec<u8>), String> {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 64 * 1024];
    let mut read_more = |raw: &mut Vec<u8>| -> Result<bool, String> {
        let n = stream.read(&mut buffer).map_err(|e| e.to_string())?;
        raw.extend_from_slice(&buffer[..n]);
        Ok(n > 0)
    };
    let end = loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if !read_more(&mut raw)? {
            return Err("the connection closed within the response's headers".into());
        }
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {head:?}"))?;
    let header = |name: &str| {
        head.lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(key, _)| key.trim() == name)
            .map(|(_, value)| value.trim().to_string())
    };
    let body_start = end + 4;
    if let Some(length) = header("content-length") {
        let length: usize = length
            .parse()
            .map_err(|e| format!("Content-Length {length:?}: {e}"))?;
        while raw.len() < body_start + length {
            if !read_more(&mut raw)? {
                return Err("the connection closed within the response's body".into());
            }
        }
        return Ok((status, raw[body_start..body_start + length].to_vec()));
    }
    if header("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
        while !raw[body_start..].ends_with(b"0\r\n\r\n") {
            if !read_more(&mut raw)? {
                return Err("the connection closed within the response's chunks".into());
            }
        }
        return Ok((status, dechunk(&raw[body_start..])?));
    }
    while read_more(&mut raw)? {}
    Ok((status, raw[body_start..].to_vec()))
}

/// A chunked HTTP body, joined.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut joined = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|e| format!("chunk size {size_text:?}: {e}"))?;
        if size == 0 {
            return Ok(joined);
        }
        let start = line_end + 2;
        let chunk = body
            .get(start..start + size)
            .ok_or("a chunk shorter than its size")?;
        joined.extend_from_slice(chunk);
        body = body.get(start + size + 2..).unwrap_or_default();
    }
}

/// Standard base64 (a screenshot), decoded.
fn base64(text: &str) -> Vec<u8> {
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("{:?} is not base64", c as char),
    };
    let mut bytes = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut held) = (0u32, 0u32);
    for c in text
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
    {
        bits = (bits << 6) | u32::from(sextet(c));
        held += 6;
        if held >= 8 {
            held -= 8;
            bytes.push((bits >> held) as u8);
            bits &= (1 << held) - 1;
        }
    }
    bytes
}

/// The built page of a chapter (`01-broadcast.md` → `BOOK/01-broadcast.html`).
fn page(book: &Path, chapter: &str) -> PathBuf {
    book.join(Path::new(chapter).with_extension("html"))
}

/// What is wrong with a chapter's page in the browser, one line each: no title, a picture that
/// did not load, an error on the console.
fn page_problems(browser: &Browser, book: &Path, chapter: &str) -> Vec<String> {
    let file = page(book, chapter);
    if !file.is_file() {
        return vec![format!("{chapter}: mdbook wrote no {}", file.display())];
    }
    browser.console(); // What earlier pages logged is theirs.
    browser.open(&file);
    // Pictures still loading get until SETTLE; then each is read.
    browser.script_until("return Array.from(document.images).every(i => i.complete) || null");
    let seen = browser.script(
        "const h1 = document.querySelector('main h1');
         return {
           h1: h1 ? h1.textContent.trim() : '',
           images: Array.from(document.images).map(i => ({
             src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth,
           })),
         };",
    );
    let mut problems = Vec::new();
    if seen["h1"].as_str().unwrap_or_default().is_empty() {
        problems.push(format!("{chapter}: no <h1> title on the page"));
    }
    let images = seen["images"].as_array().cloned().unwrap_or_default();
    for image in &images {
        let loaded = image["complete"] == json!(true) && image["width"].as_u64() > Some(0);
        if !loaded {
            problems.push(format!(
                "{chapter}: picture {} did not load (complete: {}, naturalWidth: {})",
                image["src"], image["complete"], image["width"]
            ));
        }
    }
    for (level, message) in browser.console() {
        if level == "SEVERE" {
            problems.push(format!("{chapter}: console error: {message}"));
        } else {
            eprintln!("{chapter}: console {level}: {message}");
        }
    }
    eprintln!(
        "{chapter}: {:?}, {} picture(s)",
        seen["h1"].as_str().unwrap_or_default(),
        images.len()
    );
    problems
}

/// What is wrong with the book's search: from the first page, the `s` key opens the search
/// box; typing [`SEARCH_TERM`] must list results that link to chapters, and the first result
/// must open its page with the term marked.
fn search_problems(browser: &Browser, book: &Path, pages: &[String]) -> Vec<String> {
    let first = page(book, &pages[0]);
    browser.console();
    browser.open(&first);
    browser.press("s");
    let focused = browser.script_until(
        "const bar = document.getElementById('searchbar');
         return (bar && document.activeElement === bar) || null",
    );
    if focused != json!(true) {
        return vec![format!(
            "search: the s key on {} did not open and focus the search box (#searchbar)",
            pages[0]
        )];
    }
    let Some(bar) = browser.element("#searchbar") else {
        return vec!["search: no #searchbar element".to_string()];
    };
    browser.session(
        "POST",
        &format!("/element/{bar}/value"),
        Some(json!({ "text": SEARCH_TERM })),
    );
    let results = browser.script_until(
        "const links = Array.from(document.querySelectorAll('#searchresults li a'));
         return links.length ? links.map(a => a.getAttribute('href')) : null",
    );
    let hrefs: Vec<&str> = results
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let chapter_pages: Vec<String> = pages
        .iter()
        .map(|c| Path::new(c).with_extension("html").display().to_string())
        .collect();
    let in_chapters = hrefs
        .iter()
        .filter(|href| {
            let target = href.split(['?', '#']).next().unwrap_or_default();
            chapter_pages.iter().any(|p| p == target)
        })
        .count();
    eprintln!(
        "search {SEARCH_TERM:?}: {} results, {in_chapters} in chapters, first {:?}",
        hrefs.len(),
        hrefs.first()
    );
    if in_chapters == 0 {
        return vec![format!(
            "search: {SEARCH_TERM:?} typed into the search box lists no result linking to a \
             chapter (results: {hrefs:?})"
        )];
    }
    let mut problems = Vec::new();
    // The first result, clicked, opens its page with the term marked (mark.js).
    if let Some(link) = browser.element("#searchresults li a") {
        browser.session("POST", &format!("/element/{link}/click"), Some(json!({})));
        let marked = browser.script_until(&format!(
            "const marks = Array.from(document.querySelectorAll('main mark'));
             return marks.some(m => m.textContent.toLowerCase().includes('{SEARCH_TERM}')) || null"
        ));
        if marked != json!(true) {
            problems.push(format!(
                "search: the first result ({:?}) opened {:?} with no {SEARCH_TERM:?} marked",
                hrefs[0],
                browser.session("GET", "/url", None)
            ));
        }
    }
    for (level, message) in browser.console() {
        if level == "SEVERE" {
            problems.push(format!("search: console error: {message}"));
        }
    }
    problems
}

/// Screenshots of [`SCREENSHOTS`] into `target/browser-screenshots/`: each page's top, and its
/// first picture brought into view.
fn screenshots(browser: &Browser, book: &Path) {
    let dir = profile_dir()
        .parent()
        .expect("the target folder")
        .join("browser-screenshots");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for chapter in SCREENSHOTS {
        let name = chapter.trim_end_matches(".md");
        let file = page(book, chapter);
        if !file.is_file() {
            // A chapter renamed or gone: the page checks say what the book lacks.
            eprintln!("screenshots: no {}", file.display());
            continue;
        }
        browser.open(&file);
        let mut shots = vec![(format!("{name}-top.png"), browser.screenshot())];
        let scrolled = browser.script(
            "const img = document.querySelector('main img');
             if (!img) return false;
             window.scrollTo(0, img.getBoundingClientRect().top + window.scrollY - 60);
             return true;",
        );
        if scrolled == json!(true) {
            shots.push((format!("{name}-picture.png"), browser.screenshot()));
        }
        for (file, png) in shots {
            let path = dir.join(file);
            std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    eprintln!("screenshots: {}", dir.display());
}
