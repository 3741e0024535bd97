#!/usr/bin/env bash
#GQ -J hello
#GQ -G 0
echo "hello from job $GQ_JOB_ID ($GQ_JOB_NAME) on $GQ_DEVICE"
sleep 1
