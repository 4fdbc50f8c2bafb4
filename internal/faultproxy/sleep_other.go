//go:build !linux

package faultproxy

import "time"

func nap(d time.Duration) { time.Sleep(d) }
