//! A minimal QMP client (QEMU's machine protocol, docs/interop/qmp-spec.rst): one connection
//! to a VM's `-qmp unix:...` socket. After the greeting it enters command mode
//! (`qmp_capabilities`); each [`Qmp::execute`] sends one command and returns its `return` or
//! its `error`, keeping the asynchronous events that arrive in between ([`Qmp::events`]).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long one command may take to answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A QMP connection in command mode.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: Vec<Value>,
}

impl Qmp {
    /// Connects to `path`, waiting up to `wait` for QEMU to create it, reads the greeting and
    /// negotiates command mode.
    pub fn connect(path: &Path, wait: Duration) -> std::io::Result<Qmp> {
        let until = Instant::now() + wait;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() > until => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut qmp = Qmp { reader: BufReader::new(stream), writer, events: Vec::new() };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(std::io::Error::other(format!("not a QMP greeting: {greeting}")));
        }
        qmp.execute("qmp_capabilities", json!({}))
            .map_err(|e| std::io::Error::other(format!("qmp_capabilities: {e}")))?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> std::io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "QMP connection closed"));
        }
        serde_json::from_str(&line)
            .map_err(|e| std::io::Error::other(format!("bad QMP message {line:?}: {e}")))
    }

    /// Runs `command` with `arguments` (an object) and returns its `return` value, or the
    /// error's `class: desc`, or why no reply came (QEMU exited, or took 30 s).
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let mut msg = json!({"execute": command});
        if arguments.as_object().is_some_and(|a| !a.is_empty()) {
            msg["arguments"] = arguments;
        }
        let mut bytes = serde_json::to_vec(&msg).expect("serialising a QMP command");
        bytes.push(b'\n');
        self.writer.write_all(&bytes).map_err(|e| format!("sending: {e}"))?;
        loop {
            let reply = self.read_message().map_err(|e| format!("no reply: {e}"))?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                return Err(format!(
                    "{}: {}",
                    e["class"].as_str().unwrap_or("?"),
                    e["desc"].as_str().unwrap_or("?")
                ));
            }
            // An event (e.g. MIGRATION, STOP, RESUME) between the command and its reply.
            self.events.push(reply);
        }
    }

    /// [`Qmp::execute`] that must succeed.
    pub fn run(&mut self, command: &str, arguments: Value) -> Value {
        self.execute(command, arguments).unwrap_or_else(|e| panic!("QMP {command}: {e}"))
    }

    /// The events received so far, oldest first.
    pub fn events(&self) -> &[Value] {
        &self.events
    }
}
