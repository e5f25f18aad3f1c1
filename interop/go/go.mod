module brmcp.invalid/interop

go 1.26.2

require (
	github.com/karamble/brmcp v0.1.1-0.20260721235301-3a3e08ce83f7
	github.com/modelcontextprotocol/go-sdk v1.6.1
)

require (
	github.com/agl/ed25519 v0.0.0-20170116200512-5312a6153412 // indirect
	github.com/companyzero/bisonrelay v0.2.4-0.20250321132913-c1cc5b0fd438 // indirect
	github.com/companyzero/sntrup4591761 v0.0.0-20220309191932-9e0f3af2f07a // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/decred/base58 v1.0.6 // indirect
	github.com/decred/dcrd/chaincfg/chainhash v1.0.5 // indirect
	github.com/decred/dcrd/crypto/blake256 v1.1.0 // indirect
	github.com/decred/dcrd/crypto/rand v1.0.1 // indirect
	github.com/decred/dcrd/crypto/ripemd160 v1.0.2 // indirect
	github.com/decred/dcrd/dcrec v1.0.1 // indirect
	github.com/decred/dcrd/dcrec/edwards/v2 v2.0.4 // indirect
	github.com/decred/dcrd/dcrec/secp256k1/v4 v4.4.0 // indirect
	github.com/decred/dcrd/dcrutil/v4 v4.0.3 // indirect
	github.com/decred/dcrd/txscript/v4 v4.1.2 // indirect
	github.com/decred/dcrd/wire v1.7.2 // indirect
	github.com/decred/slog v1.2.0 // indirect
	github.com/google/jsonschema-go v0.4.3 // indirect
	github.com/gorilla/websocket v1.5.3 // indirect
	github.com/jrick/logrotate v1.1.2 // indirect
	github.com/klauspost/cpuid/v2 v2.2.8 // indirect
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4 // indirect
	github.com/vctt94/bisonbotkit v0.0.2-0.20260204145852-60ab34d1acd1 // indirect
	github.com/yosida95/uritemplate/v3 v3.0.2 // indirect
	golang.org/x/crypto v0.48.0 // indirect
	golang.org/x/oauth2 v0.35.0 // indirect
	golang.org/x/sync v0.19.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	google.golang.org/protobuf v1.36.10 // indirect
	lukechampine.com/blake3 v1.3.0 // indirect
)
