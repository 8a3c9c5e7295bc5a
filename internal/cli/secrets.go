package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// secretMask is the permission bits a secret file must not have: any
// access by the file's group or by others (ssh refuses private keys the
// same way).
const secretMask fs.FileMode = 0o077

// checkSecretFile returns an error naming field and path when the file at
// path can be read, written or run by anyone but its owner, with the
// command that fixes it. A file that does not exist is not this check's
// business (the component that reads it says so).
func checkSecretFile(field, path string) error {
	if path == "" {
		return nil
	}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if perm := st.Mode().Perm(); perm&secretMask != 0 {
		fix := "chmod 600 " + path
		if st.IsDir() {
			fix = "chmod 700 " + path
		}
		return fmt.Errorf("%s: permissions %04o for %s are too open: it holds a secret and must not be accessible by group or others; run: %s",
			field, perm, path, fix)
	}
	return nil
}

// checkSecretDir checks dir itself and every file under it with
// checkSecretFile (a wallet's seed and proofs are bearer money).
func checkSecretDir(field, dir string) error {
	if dir == "" {
		return nil
	}
	if err := checkSecretFile(field, dir); err != nil {
		return err
	}
	var errs []error
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if path == dir {
			return nil
		}
		errs = append(errs, checkSecretFile(field, path))
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", field, err))
	}
	return errors.Join(errs...)
}

// checkSecrets refuses a configuration whose secret files (the Nostr key,
// the LND macaroon, the Cashu wallet, NWC URIs, the HTTP bearer token, the
// replica's credentials) others may read: capvend will not
// start with them. Only the parts cfg uses are checked.
func (c *Config) checkSecrets() error {
	var errs []error
	if len(c.Nostr.Relays) > 0 || c.Nostr.NsecFile != "" {
		errs = append(errs, checkSecretFile("nostr.nsec_file", c.Nostr.NsecFile))
	}
	if c.LND.Host != "" {
		errs = append(errs, checkSecretFile("lnd.macaroon_file", c.LND.MacaroonFile))
	}
	if len(c.Cashu.Mints) > 0 {
		errs = append(errs, checkSecretDir("cashu.wallet_dir", c.Cashu.WalletDir))
	}
	for _, conn := range c.NWC.connections() {
		errs = append(errs, checkSecretFile(conn.field, conn.uriFile))
	}
	if c.Ledger.Driver == "postgres" {
		errs = append(errs, checkSecretFile("ledger.dsn_file", c.Ledger.DSNFile))
	}
	errs = append(errs, checkSecretFile("ledger.replica_credentials_file", c.Ledger.ReplicaCredentialsFile))
	errs = append(errs, checkSecretFile("http.auth_token_file", c.HTTP.AuthTokenFile))
	errs = append(errs, checkSecretFile("admin.token_file", c.Admin.TokenFile))
	return errors.Join(errs...)
}
