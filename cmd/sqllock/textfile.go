package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// With --metrics-textfile PATH, run writes its metrics to PATH for
// node_exporter's textfile collector: at the start, after each change
// (at most every textfileEvery) and at the exit, with the exit status. So
// a lost lease under cron stays visible after the run has ended, until the
// next run of the job writes the file again. Each write is atomic: a
// temporary file in PATH's folder, renamed over PATH, so that a scrape
// never reads half a file. Every series carries the lock's name
// (sqllock_lock_name), so that the files of several jobs on one host do not
// collide.

// textfileEvery bounds how often the file is written while the command
// runs: renewals change the metrics every ttl/3.
const textfileEvery = time.Second

type textfile struct {
	path  string
	m     *metrics
	label string // the lock's name, as labels
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex // one write at a time
}

// startTextfile writes m to path once, so that a path it cannot write
// fails the command before it takes the name, and then after each change
// until close.
func startTextfile(path, name string, m *metrics) (*textfile, error) {
	tf := &textfile{path: path, m: m, label: promLabels("sqllock_lock_name", name),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := tf.write(); err != nil {
		return nil, err
	}
	m.changed = func() {
		select {
		case tf.kick <- struct{}{}:
		default:
		}
	}
	go tf.loop()
	return tf, nil
}

func (tf *textfile) loop() {
	defer close(tf.done)
	for {
		select {
		case <-tf.stop:
			return
		case <-tf.kick:
		}
		_ = tf.write() // the last write, at close, reports its error
		select {
		case <-tf.stop:
			return
		case <-time.After(textfileEvery):
		}
	}
}

// close writes the file a last time, with run's exit status.
func (tf *textfile) close(status int) error {
	close(tf.stop)
	<-tf.done
	tf.m.set("sqllock_run_exit_status", float64(status))
	tf.m.set("sqllock_run_end_time_seconds", float64(time.Now().UnixMilli())/1000)
	return tf.write()
}

// write writes the metrics to a temporary file beside path and renames it
// over path. The temporary file's name does not end in .prom, so the
// collector never reads it.
func (tf *textfile) write() error {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	var b bytes.Buffer
	tf.m.write(&b, tf.label)
	tmp, err := os.CreateTemp(filepath.Dir(tf.path), "."+filepath.Base(tf.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("--metrics-textfile: %w", err)
	}
	_, err = tmp.Write(b.Bytes())
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), tf.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("--metrics-textfile: %w", err)
	}
	return nil
}
