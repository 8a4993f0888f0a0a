//! Prints delayq's Lua scripts as the crate composes them, as JSON: for each script its
//! text, the roles of the keys it receives (in KEYS order) and the commands it runs.
//! With a directory (a changed copy of core/src/lua), composes the copy instead: the
//! benches price such copies this way (`bench/script_cost.py`). With `--library`, this
//! build's library of functions instead: `{"name": ..., "text": ...}`.
//!
//!     cargo run -q -p delayq --example scripts [-- DIR | -- --library]

fn main() {
    let dir = std::env::args().nth(1);
    if dir.as_deref() == Some("--library") {
        let library = &*delayq::scripts::LIBRARY;
        #[allow(clippy::print_stdout)]
        {
            println!("{}", serde_json::json!({"name": library.name, "text": library.text}));
        }
        return;
    }
    let composed = match &dir {
        Some(d) => delayq::scripts::compose_from_dir(std::path::Path::new(d)),
        None => delayq::scripts::compose_from_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua")),
    };
    let scripts = composed.unwrap_or_else(|e| {
        eprintln!("scripts: {e}");
        std::process::exit(2);
    });
    let out: serde_json::Map<String, serde_json::Value> = scripts
        .into_iter()
        .map(|s| {
            let v = serde_json::json!({"lua": s.text, "keys": s.keys, "commands": s.commands});
            (s.name, v)
        })
        .collect();
    // The JSON is this example's output, for the benches to read.
    #[allow(clippy::print_stdout)]
    {
        println!("{}", serde_json::Value::Object(out));
    }
}
