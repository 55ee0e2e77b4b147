use super::*;

const NAMES: [&str; 3] = ["a.bin", "b.json", "c.txt"];

fn files() -> SetFiles<'static> {
    SetFiles::writer(&NAMES)
}

/// Version `version` of the set; the second file streamed in two writes, the others
/// given as bytes.
fn set(dir: &Path, version: u8) -> FileSet<'static> {
    let mut s = FileSet::new(dir, &NAMES);
    for (i, name) in NAMES.into_iter().enumerate() {
        let bytes = vec![version; 100 + name.len()];
        match i {
            1 => s
                .add_streamed(name, move |w| {
                    let (a, b) = bytes.split_at(7);
                    w.write_all(a)?;
                    Ok(w.write_all(b)?)
                })
                .unwrap(),
            _ => s.add(name, bytes).unwrap(),
        }
    }
    s
}

/// A streamed file whose writer fails half-way stops the commit before its record: the
/// previous set stays whole and verified, nothing staged is left.
#[test]
fn a_failed_stream_leaves_the_previous_set() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    set(dir, 1).commit(&mut |_| Ok(()))?;
    let mut s = FileSet::new(dir, &NAMES);
    s.add(NAMES[0], vec![2; 50])?;
    s.add_streamed(NAMES[1], |w| {
        w.write_all(&[2; 10])?;
        candle::bail!("the tensor could not be read")
    })?;
    let e = s.commit(&mut |_| Ok(())).unwrap_err().to_string();
    assert!(e.contains("could not be read"), "{e}");
    assert_eq!(version(dir), Some(1));
    assert_eq!(
        verify_file_set(dir, files())?,
        FileSetState::Whole { finished: 0 }
    );
    assert_eq!(staged_count(dir), 0);
    Ok(())
}

/// The files as one version, or `None` for a mix.
fn version(dir: &Path) -> Option<u8> {
    let v: Vec<u8> = NAMES
        .iter()
        .map(|n| std::fs::read(dir.join(n)).unwrap()[0])
        .collect();
    v.iter().all(|x| *x == v[0]).then_some(v[0])
}

fn staged_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".staged"))
        .count()
}

/// A commit stopped at any point leaves, after recovery, the old set or the new one whole,
/// and no staged file; a stop before the manifest removes what it staged at once.
#[test]
fn a_commit_stopped_anywhere_recovers_whole() -> Result<()> {
    let mut points = 0;
    let tmp = tempfile::tempdir()?;
    set(tmp.path(), 1).commit(&mut |_| {
        points += 1;
        Ok(())
    })?;
    assert_eq!(points, 14); // 3 × (staging, renaming) × (before, after) + manifest × 2
    for at in 0..points {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        set(dir, 1).commit(&mut |_| Ok(()))?;
        let stopped = set(dir, 2).commit(&mut |p| match p.index == at {
            true => candle::bail!("stop"),
            false => Ok(()),
        });
        assert!(stopped.is_err());
        if at < 7 {
            assert_eq!(staged_count(dir), 0, "stopped at point {at}");
        }
        // Readers see an interrupted rename as such; the writer's recovery finishes it.
        let verified = verify_file_set(dir, files());
        let state = recover_file_set(dir, files())?;
        let v = version(dir).expect("a mix of two commits");
        assert_eq!(v, if at < 7 { 1 } else { 2 }, "stopped at point {at}");
        assert_eq!(
            verify_file_set(dir, files())?,
            FileSetState::Whole { finished: 0 }
        );
        if let FileSetState::Whole { finished } = state {
            assert_eq!(finished > 0, verified.is_err(), "point {at}");
            if let Err(e) = verified {
                assert!(e.to_string().contains("being saved"), "{e}");
                assert!(matches!(e, RunError::SaveInProgress { .. }), "{e}");
            }
        }
        assert_eq!(staged_count(dir), 0);
    }
    Ok(())
}

#[test]
fn a_damaged_file_is_named() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    assert_eq!(
        recover_file_set(tmp.path(), files())?,
        FileSetState::Unrecorded
    );
    set(tmp.path(), 1).commit(&mut |_| Ok(()))?;
    std::fs::write(tmp.path().join("b.json"), b"edited")?;
    // The reader's error is a variant a program can match.
    assert!(matches!(
        verify_file_set(tmp.path(), files()),
        Err(RunError::Damaged { .. })
    ));
    for e in [
        verify_file_set(tmp.path(), files()).map_err(candle::Error::from),
        recover_file_set(tmp.path(), files()),
    ] {
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("b.json") && e.contains("changed or damaged"),
            "{e}"
        );
    }
    assert!(FileSet::new(tmp.path(), &NAMES)
        .add("../x", vec![])
        .is_err());
    assert!(FileSet::new(tmp.path(), &NAMES)
        .add("d.bin", vec![])
        .is_err());
    Ok(())
}

fn manifest_with(entries: &[(&str, &[u8])]) -> String {
    let files: Vec<serde_json::Value> = entries
        .iter()
        .map(|(name, bytes)| {
            serde_json::json!({"name": name, "bytes": bytes.len(), "sha256": crate::checksum::sha256_hex(bytes)})
        })
        .collect();
    serde_json::json!({ "files": files }).to_string()
}

/// A crafted manifest is refused as invalid (never "resume it"), and recovery renames
/// nothing: names outside the set, paths, duplicates, an oversized manifest, one that
/// omits a file the reader loads.
#[test]
fn a_crafted_manifest_is_refused_and_nothing_is_renamed() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let outside = tmp.path().join("outside.txt");
    std::fs::write(&outside, b"keep")?;
    let dir = tmp.path().join("run");
    std::fs::create_dir(&dir)?;
    let payload: &[u8] = b"payload";
    let absolute = outside.display().to_string();
    let cases = [
        manifest_with(&[(&absolute, payload)]),
        manifest_with(&[("../outside.txt", payload)]),
        manifest_with(&[("d.bin", payload)]),
        manifest_with(&[("a.bin", payload), ("a.bin", payload)]),
        format!("{{\"files\":[], \"pad\": \"{}\"}}", "x".repeat(70_000)),
        "{\"files\": [{\"name\": \"a.bin\", \"bytes\": 1, \"sha256\": \"zz\"}]}".into(),
    ];
    for (i, manifest) in cases.iter().enumerate() {
        std::fs::write(dir.join(MANIFEST_FILE), manifest)?;
        std::fs::write(dir.join(".a.bin.staged"), payload)?;
        // A variant a program can match, naming the manifest.
        match verify_file_set(&dir, files()) {
            Err(RunError::InvalidManifest { manifest, .. }) => {
                assert_eq!(manifest, dir.join(MANIFEST_FILE), "case {i}")
            }
            other => panic!("case {i}: expected InvalidManifest, got {other:?}"),
        }
        for e in [
            verify_file_set(&dir, files()).map_err(candle::Error::from),
            recover_file_set(&dir, files()),
        ] {
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("not a valid checkpoint manifest") && !e.contains("resum"),
                "case {i}: {e}"
            );
        }
        assert_eq!(std::fs::read(&outside)?, b"keep", "case {i}");
        assert!(!dir.join("a.bin").exists(), "case {i}");
    }
    // Every file the reader loads must be listed.
    std::fs::write(dir.join("a.bin"), payload)?;
    std::fs::write(dir.join("b.json"), b"tampered")?;
    std::fs::write(
        dir.join(MANIFEST_FILE),
        manifest_with(&[("a.bin", payload)]),
    )?;
    let read = SetFiles {
        allowed: &NAMES,
        read: &["a.bin", "b.json"],
    };
    let e = verify_file_set(&dir, read).unwrap_err().to_string();
    assert!(e.contains("does not list b.json"), "{e}");
    std::fs::write(dir.join(MANIFEST_FILE), "{\"files\": []}")?;
    assert!(verify_file_set(&dir, read).is_err());
    Ok(())
}

/// Links planted where a commit or a recovery writes (the files, their staged names, the
/// manifest) never get the target changed.
#[cfg(unix)]
#[test]
fn links_in_the_directory_are_never_written_through() -> Result<()> {
    let targets = |dir: &Path| {
        let mut v: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
        v.extend(NAMES.iter().map(|n| staged_name(n)));
        v.push(MANIFEST_FILE.into());
        v.into_iter().map(|n| dir.join(n)).collect::<Vec<_>>()
    };
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    for (i, link) in targets(&dir).into_iter().enumerate() {
        let _ = std::fs::remove_dir_all(&dir);
        set(&dir, 1).commit(&mut |_| Ok(()))?;
        let outside = tmp.path().join(format!("outside-{i}"));
        std::fs::write(&outside, b"keep")?;
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&outside, &link)?;
        let _ = set(&dir, 2).commit(&mut |_| Ok(()));
        let _ = recover_file_set(&dir, files());
        assert_eq!(std::fs::read(&outside)?, b"keep", "{}", link.display());
    }
    Ok(())
}
