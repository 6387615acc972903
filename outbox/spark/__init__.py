"""The Spark pipeline: a Kafka source for PySpark, the Kafka -> inbox streaming job, the delivery
audit and replay. Needs the `spark` extra (pyspark 4.x) and Java 17; importing this package does
not import pyspark."""
