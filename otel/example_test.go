package sqllockotel_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sqllock/sqllock"
	sqllockotel "github.com/sqllock/sqllock/otel"
	"go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// A service that serves its locks' metrics to Prometheus: `curl
// localhost:9464/metrics` shows sqllock_acquire_duration_seconds,
// sqllock_lease_held, sqllock_lease_lost_total and the rest.
func ExampleNewObserver_prometheus() {
	exporter, err := prometheus.New() // registers with Prometheus's default registry
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	obs, err := sqllockotel.NewObserver(sqllockotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}

	db, err := sql.Open("mysql", os.Getenv("SQLLOCK_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db, sqllock.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	http.Handle("/metrics", promhttp.Handler())
	go func() { log.Fatal(http.ListenAndServe("localhost:9464", nil)) }()

	err = locks.Do(context.Background(), "nightly-report", time.Minute, func(ctx context.Context, _ *sqllock.Lock) error {
		return nil // the report
	})
	if err != nil {
		log.Print(err)
	}
}
