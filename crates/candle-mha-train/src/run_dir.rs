//! The names of every file and folder a run directory holds (and a checkpoint folder inside
//! it), in one place:
//!
//! ```text
//! RUN/
//!   .lock                  LOCK_FILE: the owning process (DirLock)
//!   checkpoint.json        MANIFEST_FILE: the commit record of the checkpoint's files
//!   model.safetensors      MODEL_FILE
//!   config.json            CONFIG_FILE
//!   optimizer.safetensors  OPTIMIZER_FILE
//!   trainer_state.json     STATE_FILE
//!   lora.json              LORA_FILE: a LoRA run's adapter spec and base (crate::run::lora)
//!   vocab.json | tokenizer.json   VOCAB_FILE | TOKENIZER_FILE
//!   metrics.jsonl          METRICS_FILE
//!   best/                  BEST_DIR: the checkpoint of the best validation loss
//!   data/                  RUN_DATA_DIR: text prepared for the run (text runs only)
//! ```
//!
//! PyTorch equivalent: none (a training script's own `out_dir` layout).

/// The model's weights in a checkpoint directory.
pub const MODEL_FILE: &str = "model.safetensors";
/// The model's configuration in a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// The optimizer's state in a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The trainer's state in a checkpoint directory.
pub const STATE_FILE: &str = "trainer_state.json";
/// The file a symbol vocabulary is stored in, beside the model.
pub const VOCAB_FILE: &str = "vocab.json";
/// The file a `tokenizers` tokenizer is stored in, beside the model (and in a data
/// directory).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// A LoRA run's adapter configuration and base run ([`crate::run::lora::LoraRecord`]).
pub const LORA_FILE: &str = "lora.json";
/// Every file a checkpoint's manifest may list.
pub const CHECKPOINT_FILES: [&str; 7] = [
    MODEL_FILE,
    CONFIG_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    VOCAB_FILE,
    TOKENIZER_FILE,
    LORA_FILE,
];
/// The commit record of a set of files in its directory (a checkpoint's `checkpoint.json`).
pub const MANIFEST_FILE: &str = "checkpoint.json";
/// The lock file of a directory owned by one process (a run, or a data directory).
pub const LOCK_FILE: &str = ".lock";
/// The metrics log of a run.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The subdirectory holding the checkpoint of the best validation loss.
pub const BEST_DIR: &str = "best";
/// Where a session prepares the text of a text run, inside the run directory.
pub const RUN_DATA_DIR: &str = "data";
