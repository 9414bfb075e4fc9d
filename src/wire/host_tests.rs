//! Host normalisation and formatting, and the numeric-host parser checked against
//! `url::Host::parse`. The tables of odd host forms are in `src/upstream/hostform_tests.rs`,
//! beside the address classes they decide.

use super::*;

    #[test]
    fn normalises_case_trailing_dot_and_ipv6_brackets() {
        assert_eq!(
            normalize_host("API.Example.COM.").as_deref(),
            Ok("api.example.com")
        );
        assert_eq!(normalize_host("[::1]").as_deref(), Ok("::1"));
        assert_eq!(normalize_host("[0:0::1]").as_deref(), Ok("::1"));
        assert_eq!(normalize_host("127.0.0.1").as_deref(), Ok("127.0.0.1"));
        assert_eq!(
            normalize_host("2852039166").as_deref(),
            Ok("169.254.169.254")
        );
        assert_eq!(
            normalize_host("0xA9FEA9FE").as_deref(),
            Ok("169.254.169.254")
        );
        assert_eq!(
            normalize_host("[::ffff:169.254.169.254]").as_deref(),
            Ok("::ffff:169.254.169.254")
        );
    }

    #[test]
    fn rejects_odd_host_forms() {
        assert!(normalize_host("").is_err());
        assert!(normalize_host(".").is_err());
        assert!(normalize_host("a..b").is_err());
        assert!(normalize_host("a b").is_err());
        assert!(normalize_host("a/b").is_err());
        assert!(normalize_host("user@host").is_err());
        assert!(normalize_host("bücher.de").is_err());
        assert!(normalize_host("[127.0.0.1]").is_err());
        assert!(normalize_host("256.1.1.1").is_err());
        assert!(normalize_host("1.2.3.4.5").is_err());
        assert!(normalize_host(&"a".repeat(64)).is_err());
    }
