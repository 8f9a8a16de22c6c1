//! Tokenizer tests on small vocabularies made here. The SmolLM2 vocabulary is tested against
//! llama.cpp's ids in `llm/tests/tokenizer.rs`.

use super::*;

/// A byte-level BPE vocabulary: the 256 byte characters, three control tokens, one
/// user-defined token and the tokens of `merges`.
fn bpe_spec(pre: &str, merges: &[&str]) -> VocabSpec {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<s>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3, 3, 3];
    tokens.push("<tool>".into());
    types.push(4);
    for c in bpe::byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos: Some(1),
        eos: Some(2),
        ..VocabSpec::default()
    }
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    t.token_id(text)
        .unwrap_or_else(|| panic!("no token {text:?}"))
}

#[test]
fn bpe_encodes_merges_and_round_trips() {
    let t = Tokenizer::new(bpe_spec("gpt-2", &["h e", "l l", "he ll", "hell o", "Ġ w"])).unwrap();
    let ids = t.encode("hello wé", false, false).unwrap();
    let c = bpe::byte_chars();
    let e_acute: Vec<u32> = "é"
        .bytes()
        .map(|b| id(&t, &c[b as usize].to_string()))
        .collect();
    let mut want = vec![id(&t, "hello"), id(&t, "Ġw")];
    want.extend(e_acute);
    assert_eq!(ids, want);
    assert_eq!(t.decode(&ids).unwrap(), "hello wé");
    assert_eq!(t.encode("", true, true).unwrap(), Vec::<u32>::new());
}

#[test]
fn special_tokens_need_parse_special_but_user_defined_do_not() {
    let t = Tokenizer::new(bpe_spec("gpt-2", &[])).unwrap();
    let plain = t.encode("a<|im_end|>", false, false).unwrap();
    assert_eq!(plain.len(), 1 + "<|im_end|>".len());
    assert_eq!(
        t.encode("a<|im_end|>b", false, true).unwrap(),
        [id(&t, "a"), 2, id(&t, "b")]
    );
    // The longest special token wins: `<s>` inside nothing else here, `<tool>` always parsed.
    assert_eq!(t.encode("<tool><s>", false, false).unwrap()[0], 3);
    assert_eq!(t.encode("<tool><s>", false, true).unwrap(), [3, 1]);
    assert_eq!(t.decode(&[id(&t, "a"), 2, 3]).unwrap(), "a<|im_end|><tool>");
}

#[test]
fn add_special_follows_the_vocabulary() {
    let mut spec = bpe_spec("gpt-2", &[]);
    let t = Tokenizer::new(spec.clone()).unwrap();
    assert_eq!(t.encode("a", true, false).unwrap(), [id(&t, "a")]);
    spec.add_bos = true;
    spec.add_eos = true;
    let t = Tokenizer::new(spec).unwrap();
    assert_eq!(t.encode("a", true, false).unwrap(), [1, id(&t, "a"), 2]);
    assert_eq!(t.encode("a", false, false).unwrap(), [id(&t, "a")]);
}

#[test]
fn eog_includes_eos_and_end_of_turn_markers() {
    let spec = bpe_spec("gpt-2", &[]);
    assert_eq!(spec.llama_cpp_eog(&[7]), vec![0, 2, 7]);
    let t = Tokenizer::new(VocabSpec {
        eog: vec![3],
        ..spec
    })
    .unwrap();
    assert!(t.is_eog(2) && t.is_eog(3));
    assert!(!t.is_eog(1) && !t.is_eog(0) && !t.is_eog(99_999));
    assert_eq!(t.eog_tokens().collect::<Vec<_>>(), [2, 3]);
    assert_eq!((t.bos(), t.eos(), t.unk()), (Some(1), Some(2), None));
    assert!(t.is_control(0) && !t.is_control(3));
}

#[test]
fn bad_specs_and_ids_are_errors() {
    let ok = bpe_spec("gpt-2", &[]);
    let bad = [
        VocabSpec {
            tokens: vec![],
            ..ok.clone()
        },
        VocabSpec {
            model: "wordpiece".into(),
            ..ok.clone()
        },
        VocabSpec {
            token_types: vec![1],
            ..ok.clone()
        },
        VocabSpec {
            scores: vec![0.0],
            ..ok.clone()
        },
        VocabSpec {
            bos: Some(1 << 20),
            ..ok.clone()
        },
        VocabSpec {
            eog: vec![1 << 20],
            ..ok.clone()
        },
        VocabSpec {
            add_eos: true,
            eos: None,
            ..ok.clone()
        },
    ];
    for spec in bad {
        assert!(matches!(Tokenizer::new(spec), Err(Error::Model(_))));
    }
    let t = Tokenizer::new(ok).unwrap();
    assert!(matches!(t.token_to_piece(1 << 20), Err(Error::Invalid(_))));
    assert!(t.decode(&[5, 1 << 20]).is_err());
    assert!(t.token_text(1 << 20).is_err());
}

#[test]
fn pre_tokenizer_names() {
    // An unknown name is an error naming it; no name is llama.cpp's default.
    let e = Tokenizer::new(bpe_spec("no-such-pre", &[])).unwrap_err();
    assert!(e.to_string().contains("'no-such-pre'"), "{e}");
    let t = Tokenizer::new(VocabSpec {
        pre: None,
        ..bpe_spec("gpt-2", &["1 2", "12 3"])
    })
    .unwrap();
    // The default splits digits in threes: `123` merges, `4` stays alone.
    assert_eq!(
        t.encode("1234", false, false).unwrap(),
        [id(&t, "123"), id(&t, "4")]
    );
    for name in ["llama-bpe", "qwen2", "smollm", "default"] {
        assert!(Tokenizer::new(bpe_spec(name, &[])).is_ok(), "{name}");
    }
}

#[test]
fn right_stripped_special_tokens_drop_the_space_after_them() {
    let spec = bpe_spec("gpt-2", &[]);
    let plain = Tokenizer::new(spec.clone()).unwrap();
    let t = Tokenizer::new(VocabSpec {
        rstrip: vec![2, 3],
        ..spec
    })
    .unwrap();
    let text = "a<|im_end|> \n\tb<tool>  c <tool>";
    let want = [id(&t, "a"), 2, id(&t, "b"), 3, id(&t, "c"), id(&t, "Ġ"), 3];
    assert_eq!(t.encode(text, false, true).unwrap(), want);
    assert!(plain.encode(text, false, true).unwrap().len() > want.len());
    // Only after a token that is cut out: without parse_special `<|im_end|>` is text.
    assert!(t.encode(text, false, false).unwrap().len() > want.len());
    let bad = VocabSpec {
        rstrip: vec![1 << 20],
        ..bpe_spec("gpt-2", &[])
    };
    assert!(matches!(Tokenizer::new(bad), Err(Error::Model(_))));
}

#[test]
fn phi3_right_strips_specials_but_not_bos_unk_and_endoftext() {
    let tokens: Vec<String> = [
        "<unk>",
        "<s>",
        "</s>",
        "<|endoftext|>",
        "<|end|>",
        "<|user|>",
        "a",
    ]
    .iter()
    .map(|t| t.to_string())
    .collect();
    // `<|end|>` is normal in the file but an end-of-turn marker to llama.cpp.
    let types = [2, 3, 1, 3, 1, 4, 1];
    assert_eq!(phi3_rstrip(&tokens, &types), [2, 4, 5]);
}

#[test]
fn clean_up_spaces_like_llama_cpp() {
    let clean = |s: &str| {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    };
    assert_eq!(clean("Hi , you ! ok ? a . b"), "Hi, you! ok? a. b");
    assert_eq!(clean("a ' b"), "a'b");
    assert_eq!(
        clean("it 's we 're they 've I 'm you 'll he 'd"),
        "it's we're they've I'm you 'll he 'd"
    );
    assert_eq!(clean("a ' ' b"), "a'' b");
    assert_eq!(clean(" "), " ");
    assert_eq!(clean(""), "");
}

#[test]
fn stream_decoder_waits_for_whole_characters() {
    let t = Tokenizer::new(bpe_spec("gpt-2", &[])).unwrap();
    let ids = t.encode("aé😀", false, false).unwrap();
    assert_eq!(ids.len(), 1 + 2 + 4);
    let mut d = StreamDecoder::new();
    let outs: Vec<String> = ids.iter().map(|&i| d.push(&t, i).unwrap()).collect();
    assert_eq!(outs, ["a", "", "é", "", "", "", "😀"]);
    assert_eq!(d.finish(), "");
    // A cut character comes out as U+FFFD at the end; a bad byte at once.
    assert_eq!(d.push(&t, ids[1]).unwrap(), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    let cont = ids[2]; // a continuation byte on its own
    assert_eq!(d.push(&t, cont).unwrap(), "\u{FFFD}");
    assert_eq!(d.push(&t, ids[0]).unwrap(), "a");
    assert!(d.push(&t, 1 << 20).is_err());
}

/// A SentencePiece-style vocabulary: `<unk> <s> </s>`, the 256 byte tokens and some pieces.
fn spm_spec() -> VocabSpec {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("▁h", -3.0),
        ("ll", -3.5),
        ("▁he", -4.0),
        ("▁hell", -5.0),
        ("▁hello", -6.0),
        ("lo", -7.0),
    ] {
        tokens.push(piece.into());
        types.push(1);
        scores.push(score);
    }
    VocabSpec {
        model: "llama".into(),
        tokens,
        token_types: types,
        scores,
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        add_bos: true,
        add_space_prefix: true,
        ..VocabSpec::default()
    }
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_byte_fallback() {
    let t = Tokenizer::new(spm_spec()).unwrap();
    let ids = t.encode("hello wé", true, false).unwrap();
    let mut want = vec![1, id(&t, "▁hello"), id(&t, "▁"), id(&t, "w")];
    want.extend("é".bytes().map(|b| id(&t, &format!("<0x{b:02X}>"))));
    assert_eq!(ids, want);
    // The first token's leading space is dropped; after BOS it is kept, as in llama.cpp.
    assert_eq!(t.decode(&ids[1..]).unwrap(), "hello wé");
    assert_eq!(t.decode(&ids).unwrap(), "<s> hello wé");
    assert_eq!(t.encode("", true, false).unwrap(), [1]);
    assert_eq!(t.encode("", false, false).unwrap(), Vec::<u32>::new());
}

#[test]
fn spm_puts_a_space_after_special_tokens() {
    let t = Tokenizer::new(spm_spec()).unwrap();
    let ids = t.encode("he</s>he", false, true).unwrap();
    assert_eq!(ids, [id(&t, "▁he"), 2, id(&t, "▁he")]);
    let ids = t.encode("he</s>he", false, false).unwrap();
    assert_eq!(ids[0], id(&t, "▁he"));
    assert!(!ids.contains(&2));
}

#[test]
fn spm_without_byte_tokens_uses_unk() {
    let mut spec = spm_spec();
    spec.tokens[3 + 0xC3] = "<unused>".into();
    let t = Tokenizer::new(spec.clone()).unwrap();
    let ids = t.encode("é", false, false).unwrap();
    assert_eq!(ids, [id(&t, "▁"), 0, id(&t, "<0xA9>")]);
    spec.unk = None;
    let t = Tokenizer::new(spec).unwrap();
    assert!(matches!(t.encode("é", false, false), Err(Error::Model(_))));
}
