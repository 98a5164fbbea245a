//! A small W3C WebDriver client, for tests that drive the console in a real browser: it starts
//! `chromedriver` on a free port (killed on drop), opens one headless Chromium session, and
//! offers the few commands a person's walk through the pages needs. It is test code: a command
//! that fails panics with WebDriver's own error and message.
//!
//! The binaries come from `ASIENTO_TEST_CHROMEDRIVER` and `ASIENTO_TEST_CHROMIUM` (set by
//! `scripts/test`, which installs Debian's `chromium` and `chromium-driver`), else from `PATH`;
//! without them the test fails, it is never skipped.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::free_port;

/// How long an element may take to appear, and a navigation to land.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long chromedriver may take to say it is ready.
const DRIVER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a page may take to load (the session's page load timeout).
const PAGE_LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one WebDriver command may take over HTTP: a page load and some.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long dropping the browser may wait for chromedriver to close Chromium.
const QUIT_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The key under which W3C WebDriver names an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver error as the driver answered it (`no such element`, its message).
#[derive(Debug)]
pub struct DriverError {
    pub error: String,
    pub message: String,
}

/// The running chromedriver process; killed when dropped, so that a failed session start does
/// not leave it behind.
struct Driver {
    child: Child,
    address: SocketAddr,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One headless Chromium session behind its own chromedriver.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:{port}/session/{id}`: the prefix of every command.
    session_url: String,
    session_id: String,
    /// Killed after `Drop for Browser` has closed the session.
    driver: Driver,
}

impl Browser {
    /// Starts chromedriver and opens a headless session (1280×1000, no sandbox: tests run as
    /// root in containers, where Chromium's sandbox cannot start).
    pub async fn start() -> Self {
        let chromedriver = binary("ASIENTO_TEST_CHROMEDRIVER", &["chromedriver"]);
        let chromium = binary("ASIENTO_TEST_CHROMIUM", &["chromium", "chromium-browser"]);
        let port = free_port();
        let child = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            // Its banner only; its errors reach the test's output.
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", chromedriver.display()));
        let mut driver = Driver {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let http = reqwest::Client::builder()
            .timeout(COMMAND_TIMEOUT)
            .build()
            .expect("http client");
        let base = format!("http://{}", driver.address);
        wait_until_ready(&http, &base, &mut driver).await;

        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "timeouts": {
                        "implicit": 0,
                        "pageLoad": PAGE_LOAD_TIMEOUT.as_millis() as u64,
                        "script": PAGE_LOAD_TIMEOUT.as_millis() as u64,
                    },
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--window-size=1280,1000",
                        ],
                    },
                },
            },
        });
        let session = request(
            &http,
            reqwest::Method::POST,
            &format!("{base}/session"),
            Some(capabilities),
        )
        .await
        .unwrap_or_else(|error| {
            panic!("WebDriver new session: {}: {}", error.error, error.message)
        });
        let session_id = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no sessionId in {session}"))
            .to_owned();
        Self {
            http,
            session_url: format!("{base}/session/{session_id}"),
            session_id,
            driver,
        }
    }

    /// Sends one command of the session; its `value`, or the driver's error.
    pub async fn try_command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, DriverError> {
        request(
            &self.http,
            method,
            &format!("{}{path}", self.session_url),
            body,
        )
        .await
    }

    /// [`Browser::try_command`], panicking with the driver's error.
    pub async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let described = format!("{method} {path}");
        self.try_command(method, path, body)
            .await
            .unwrap_or_else(|error| {
                panic!("WebDriver {described}: {}: {}", error.error, error.message)
            })
    }

    /// Navigates to `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    pub async fn current_url(&self) -> String {
        string(self.command(reqwest::Method::GET, "/url", None).await)
    }

    /// The path of the current URL (`/console/payments`).
    pub async fn path(&self) -> String {
        let url = self.current_url().await;
        reqwest::Url::parse(&url)
            .unwrap_or_else(|error| panic!("the browser is at {url:?}: {error}"))
            .path()
            .to_owned()
    }

    /// Waits until the current path satisfies `done` (a navigation landing) and returns it.
    pub async fn wait_for_path(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT_TIMEOUT;
        loop {
            let path = self.path().await;
            if done(&path) {
                return path;
            }
            assert!(
                Instant::now() < deadline,
                "the browser never reached {what}: it is at {}\n{}",
                self.current_url().await,
                self.body_text().await
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The element matching `css`, waiting up to [`WAIT_TIMEOUT`] for it to appear.
    pub async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + WAIT_TIMEOUT;
        loop {
            let found = self
                .try_command(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({ "using": "css selector", "value": css })),
                )
                .await;
            match found {
                Ok(element) => return element_id(&element),
                Err(error) if error.error == "no such element" && Instant::now() < deadline => {
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
                Err(error) => panic!(
                    "no element {css:?} at {}: {}: {}",
                    self.current_url().await,
                    error.error,
                    error.message
                ),
            }
        }
    }

    /// Every element matching `css` now, without waiting (none is an empty list).
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .command(
                reqwest::Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        found
            .as_array()
            .unwrap_or_else(|| panic!("elements {css:?}: {found}"))
            .iter()
            .map(element_id)
            .collect()
    }

    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Types `text` into the field matching `css`, after what it already holds.
    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn clear(&self, css: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            Some(json!({})),
        )
        .await;
    }

    /// The rendered text of the element matching `css`, as a person sees it. An element the
    /// page replaced between finding and reading it (a form's answer arriving) is found again.
    pub async fn text(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + WAIT_TIMEOUT;
        loop {
            let element = self.find(css).await;
            let path = format!("/element/{element}/text");
            match self.try_command(reqwest::Method::GET, &path, None).await {
                Ok(text) => return string(text),
                Err(error)
                    if error.error == "stale element reference"
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(error) => panic!("WebDriver GET {path}: {}: {}", error.error, error.message),
            }
        }
    }

    /// A property of the element matching `css` (`href` resolved against the page).
    pub async fn property(&self, css: &str, name: &str) -> Value {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::GET,
            &format!("/element/{element}/property/{name}"),
            None,
        )
        .await
    }

    /// The whole page's rendered text.
    pub async fn body_text(&self) -> String {
        self.text("body").await
    }

    pub async fn page_source(&self) -> String {
        string(self.command(reqwest::Method::GET, "/source", None).await)
    }

    /// Saves a PNG of the viewport to `path` (its folder created).
    pub async fn screenshot(&self, path: &Path) {
        let encoded = string(
            self.command(reqwest::Method::GET, "/screenshot", None)
                .await,
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .expect("a screenshot in base64");
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder)
                .unwrap_or_else(|error| panic!("create {}: {error}", folder.display()));
        }
        std::fs::write(path, png)
            .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
    }

    /// The cookies the browser holds for the current page (WebDriver's cookie objects: `name`,
    /// `value`, `httpOnly`, `sameSite` …).
    pub async fn get_cookies(&self) -> Vec<Value> {
        match self.command(reqwest::Method::GET, "/cookie", None).await {
            Value::Array(cookies) => cookies,
            other => panic!("cookies: {other}"),
        }
    }
}

impl Drop for Browser {
    /// Closes the session, so that chromedriver ends Chromium and removes its profile; then
    /// the driver is killed. Blocking on a plain socket: a drop cannot await, and it may run
    /// while a failed test unwinds.
    fn drop(&mut self) {
        let Ok(mut stream) = TcpStream::connect_timeout(&self.driver.address, QUIT_TIMEOUT) else {
            return;
        };
        let _ = stream.set_read_timeout(Some(QUIT_TIMEOUT));
        let _ = stream.set_write_timeout(Some(QUIT_TIMEOUT));
        let request = format!(
            "DELETE /session/{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.session_id, self.driver.address
        );
        if stream.write_all(request.as_bytes()).is_ok() {
            let _ = stream.read_to_end(&mut Vec::new());
        }
    }
}

/// Sends one WebDriver request: the answer's `value`, or its error.
async fn request(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, DriverError> {
    let mut request = http.request(method.clone(), url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|error| panic!("WebDriver {method} {url}: {error}"));
    let status = response.status();
    let text = response
        .text()
        .await
        .unwrap_or_else(|error| panic!("WebDriver {method} {url}: {error}"));
    let mut answer: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("WebDriver {method} {url}: {status}, not JSON: {text}"));
    let value = answer["value"].take();
    if status.is_success() {
        return Ok(value);
    }
    Err(DriverError {
        error: value["error"]
            .as_str()
            .unwrap_or("unknown error")
            .to_owned(),
        message: value["message"].as_str().unwrap_or(&text).to_owned(),
    })
}

/// Waits until chromedriver answers that it is ready; panics if it exits or takes too long.
async fn wait_until_ready(http: &reqwest::Client, base: &str, driver: &mut Driver) {
    let deadline = Instant::now() + DRIVER_START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = driver.child.try_wait() {
            panic!(
                "chromedriver exited at start ({status}); is port {} taken?",
                driver.address.port()
            );
        }
        let ready = match http.get(format!("{base}/status")).send().await {
            Ok(response) => response
                .json::<Value>()
                .await
                .is_ok_and(|status| status["value"]["ready"] == true),
            Err(_) => false,
        };
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "chromedriver was not ready at {base} within {DRIVER_START_TIMEOUT:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The binary named by `variable`, else the first of `names` on `PATH`.
fn binary(variable: &str, names: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(variable).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{variable}={} is not a file; run scripts/test, which installs chromium and chromium-driver",
            path.display()
        );
        return path;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    names
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |folder| folder.join(name)))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{variable} is unset and none of {names:?} is on PATH: the browser tests need \
                 Chromium and chromedriver; run scripts/test, which installs chromium and \
                 chromium-driver"
            )
        })
}

fn element_id(element: &Value) -> String {
    element[ELEMENT_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("not an element reference: {element}"))
        .to_owned()
}

fn string(value: Value) -> String {
    match value {
        Value::String(text) => text,
        other => panic!("expected a string, got {other}"),
    }
}
