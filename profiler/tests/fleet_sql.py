"""Runs SQL queries over a hive-partitioned directory of profile tables in one engine.

Usage: python fleet_sql.py ENGINE ROOT < queries.json, ENGINE one of duckdb, polars,
spark. Each engine names every table directory under ROOT as a view, as the README
shows, runs the queries in order, and prints their results as JSON: a list of
{"columns": [...], "rows": [[...], ...]} with times as ISO 8601 text in UTC.
"""

import datetime
import json
import os
import sys


def plain(value):
    """A value as JSON holds it: times as UTC text without the zone."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    return value


def tables(root):
    return sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))


def duckdb_results(root, queries):
    import duckdb

    con = duckdb.connect()
    for t in tables(root):
        path = os.path.join(root, t, "*", "*", "*.parquet")
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{path}', hive_partitioning = true)")
    for q in queries:
        r = con.sql(q)
        yield r.columns, r.fetchall()


def polars_results(root, queries):
    import polars as pl

    ctx = pl.SQLContext(
        {t: pl.scan_parquet(os.path.join(root, t, "**", "*.parquet"), hive_partitioning=True) for t in tables(root)}
    )
    for q in queries:
        frame = ctx.execute(q.strip().rstrip(";")).collect()
        yield frame.columns, frame.rows()


def spark_results(root, queries):
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("neuron-profile fleet tables")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for t in tables(root):
            spark.read.parquet(os.path.join(root, t)).createOrReplaceTempView(t)
        for q in queries:
            frame = spark.sql(q.strip().rstrip(";"))
            yield frame.columns, [list(r) for r in frame.collect()]
    finally:
        spark.stop()


def main():
    engine, root = sys.argv[1], sys.argv[2]
    queries = json.load(sys.stdin)
    run = {"duckdb": duckdb_results, "polars": polars_results, "spark": spark_results}[engine]
    out = [{"columns": list(c), "rows": [[plain(v) for v in row] for row in rows]} for c, rows in run(root, queries)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
