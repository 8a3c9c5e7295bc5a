package testnet

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/capvend/capvend/internal/pgserver"
)

// startPostgres creates the cluster in DIR/postgres (initdb), starts
// postgres in the foreground as a process of the stack (stopped with the
// others), waits until it accepts connections and creates the database
// "capvend".
func (s *Stack) startPostgres(ctx context.Context) error {
	pg := s.Info.Postgres
	_, port, err := net.SplitHostPort(pg.Listen)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	srv, err := pgserver.Init(ctx, pg.DataDir, pgserver.Options{Port: p})
	if err != nil {
		return &ComponentError{Component: "postgres", Err: err}
	}
	pg.DataDir = srv.Dir
	argv := srv.Command()
	if pg.Proc, err = spawn(argv[0], argv[1:], pg.Log, !s.detach); err != nil {
		return &ComponentError{Component: "postgres", Log: pg.Log, Err: err}
	}
	s.record()
	err = poll(ctx, readyTimeout, 100*time.Millisecond, "postgres", func() (bool, error) {
		if !pg.Alive() {
			return false, errors.New("exited during start")
		}
		return srv.Ready(ctx), nil
	})
	if err != nil {
		return &ComponentError{Component: "postgres", Log: pg.Log, Err: err}
	}
	if pg.DSN, err = srv.CreateDatabase(ctx, "capvend"); err != nil {
		return &ComponentError{Component: "postgres", Log: pg.Log, Err: err}
	}
	s.record()
	return nil
}
